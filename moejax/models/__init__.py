"""Flax NNX MoE decoder, expert compute and layer-stepped execution."""

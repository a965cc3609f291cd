"""Analyses of routing traces."""

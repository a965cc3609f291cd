"""Routing traces: the recorded gate outputs of runs, their file format, and importers."""

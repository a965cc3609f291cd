"""The expert cache: residency, transfers, metrics, and the live runtime."""

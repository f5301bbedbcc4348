"""Scenarios users run with ``cutline simulate NAME``."""

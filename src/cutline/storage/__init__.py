"""Checkpoint storage: layout, metadata written last, retention, savepoints."""

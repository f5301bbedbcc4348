"""State backends."""

"""Models rebuilt from the seed articles, with seeded random weights (no downloads)."""

__all__ = ["seeds"]

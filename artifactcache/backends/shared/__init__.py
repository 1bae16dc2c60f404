"""Pieces more than one backend uses (see backends/__init__.py)."""

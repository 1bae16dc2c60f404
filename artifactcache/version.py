"""acache's version, a key factor of every artifact (code_factors.acache_factors)."""

__version__ = "0.1.0"

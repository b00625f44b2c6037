"""The package version, in one place (the kernels key their disk caches on it; importing it imports nothing)."""

__version__ = "0.1.0"

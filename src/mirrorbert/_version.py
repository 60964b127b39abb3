"""The package version, in a module of its own so that any layer may record it without importing the package root."""

__version__ = "0.1.0"

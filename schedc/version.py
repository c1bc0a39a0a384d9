"""The package version, in the core so that any module may name it without importing the package."""

__version__ = "0.1.0"

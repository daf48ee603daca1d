"""The release of cpbjax: a leaf, so that any module can name it without importing the package."""

__version__ = "0.1.0"

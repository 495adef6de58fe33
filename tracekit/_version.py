"""The package version, in a leaf module: the stages import it from here, not from the root package
(whose lazy attributes reach the capture and the notebook API; docs/ARCHITECTURE.md)."""

__version__ = "0.1.0"

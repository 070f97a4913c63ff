"""cudalab: reproducible CUDA memory-hierarchy experiments."""

__version__ = "0.1.0"

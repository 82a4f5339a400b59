"""tilec: a compiler for fused tile kernels (.tile -> CUDA / HIP / C++)."""

__version__ = "0.1.0"

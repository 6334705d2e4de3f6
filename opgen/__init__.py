"""opgen: YAML operator specs -> tuned CUDA kernels for quantized matmuls."""
__version__ = "0.1.0"

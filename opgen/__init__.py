"""opgen: YAML operator specs -> tuned CUDA kernels for quantized matmuls.

`opgen.load("gptq_v2_w4a16_g128", N=4096, K=4096)(a, qweight, scales, zeros)`:
a callable matmul op (runtime/op.py)."""
from .codegen.version import __version__  # noqa: F401 (opgen.__version__)
from .runtime.op import load  # noqa: F401 (opgen.load)

"""opgen: YAML operator specs -> tuned CUDA kernels for quantized matmuls."""
__version__ = "0.1.0"


def load(spec, N=None, K=None, **kw):
    """A callable matmul op: `opgen.load("gptq_v2_w4a16_g128", N=4096, K=4096)(a, qweight, scales, zeros)`."""
    from opgen.runtime.op import load as _load
    return _load(spec, N, K, **kw)

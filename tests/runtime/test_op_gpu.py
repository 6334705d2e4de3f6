"""The user-facing ops on the GPU: opgen.load(...) with CuPy arrays (and torch
tensors when torch is there), dispatch per M bucket, argument checking, and
the op-quantize kernel against the reference (bit-exact codes)."""
import numpy as np
import pytest

import opgen
from opgen.codegen.random_data import random_activation, random_weight_tensors
from opgen.codegen.reference import quantize_activation, reference_matmul_f32
from opgen.codegen.tolerance import tolerance
from opgen.codegen.resolve import as_spec
from opgen.runtime.op import load_linear
from opgen.runtime.tiled import out_to_f32

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["quantize_int8_row", "quantize_fp8_row"])
def test_quantize_op_matches_reference(name):
    import cupy as cp
    spec = as_spec(name)
    rng = np.random.default_rng(7)
    M, K = 37, 4096 + 8
    x = (rng.standard_normal((M, K)) * rng.uniform(0.1, 10, (M, 1))).astype(np.float16)
    x[3] = 0                                    # a zero row: scale 1, codes 0
    op = opgen.load(spec, K=K)
    codes, scale = op(cp.asarray(x))
    ref_codes, ref_scale = quantize_activation(spec, x)
    np.testing.assert_array_equal(scale.get(), ref_scale)
    got = codes.get().view(np.uint8)
    assert (got == ref_codes.view(np.uint8)).mean() == 1.0


def test_dispatch_and_errors():
    import cupy as cp
    spec = as_spec("gptq_v2_w4a16_g128")
    N, K = 1024, 2048
    rng = np.random.default_rng(3)
    w = random_weight_tensors(spec, N, K, rng)
    dev = {k: cp.asarray(v) for k, v in w.items()}
    op = opgen.load(spec, N=N, K=K, use_db=False)
    for M in (1, 7, 64, 300):
        a, _ = random_activation(spec, M, K, rng)
        out = op(cp.asarray(a), dev["qweight"], dev["scales"], dev["zeros"])
        ref = reference_matmul_f32(spec, a, w)
        err = np.linalg.norm(out.get().astype(np.float64) - ref) / np.linalg.norm(ref)
        assert err <= tolerance(spec), (M, op.config_for(M).name, err)
    assert op.config_for(1).family == "gemv" and op.config_for(300).family == "gemm"
    a = cp.asarray(random_activation(spec, 4, K, rng)[0])
    with pytest.raises(ValueError, match="qweight: shape"):
        op(a, dev["qweight"][:-8], dev["scales"], dev["zeros"])
    with pytest.raises(ValueError, match="scales: dtype"):
        op(a, dev["qweight"], dev["scales"].astype(cp.float32), dev["zeros"])
    with pytest.raises(ValueError, match="zeros: required"):
        op(a, dev["qweight"], dev["scales"])
    with pytest.raises(ValueError, match="a: shape"):
        op(a[:, :-32], dev["qweight"], dev["scales"], dev["zeros"])


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    spec = as_spec("w4a16_sym_g128")
    N, K = 512, 1024
    rng = np.random.default_rng(5)
    w = random_weight_tensors(spec, N, K, rng)
    a, _ = random_activation(spec, 16, K, rng)
    op = opgen.load(spec, N=N, K=K, use_db=False)
    out = op(torch.from_numpy(a).cuda(), torch.from_numpy(w["qweight"]).cuda(),
             torch.from_numpy(w["scales"]).cuda())
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    ref = reference_matmul_f32(spec, a, w)
    err = np.linalg.norm(out.cpu().numpy().astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err <= tolerance(spec)


@pytest.mark.parametrize("name", ["w8a8_int8", "fp8_e4m3_w8a8"])
@pytest.mark.parametrize("M", [1, 16, 100, 256])
def test_fused_w8a8_linear(name, M):
    """quantize(x) -> int8/fp8 GEMM with both scales fused == the reference
    pipeline (reference quantize, then the reference matmul)."""
    import cupy as cp
    spec = as_spec(name)
    N, K = 2048, 4096
    rng = np.random.default_rng(M)
    w = random_weight_tensors(spec, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float16)
    op = load_linear(spec, N=N, K=K, use_db=False)
    out = op(cp.asarray(x), *[cp.asarray(w[k]) for k in ("qweight", "scales")])
    codes, a_scale = quantize_activation(spec, x)
    ref = reference_matmul_f32(spec, codes, w, a_scale=a_scale)
    got = out_to_f32(spec, out.get())
    err = np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err <= tolerance(spec), err

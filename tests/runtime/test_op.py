"""The user-facing ops (runtime/op.py). On the CPU: what needs no GPU. On
the GPU (gpu mark): opgen.load(...) with CuPy arrays (and torch tensors when
torch is there), dispatch per M bucket, argument checking, and the
op-quantize kernel against the reference (bit-exact codes)."""
import numpy as np
import pytest

import opgen
from opgen.codegen import planner
from opgen.codegen.compiler import CompileError, default_config
from opgen.codegen.errors import UserError
from opgen.codegen.random_data import random_activation, random_weight_tensors
from opgen.codegen.reference import dequantize, quantize_activation, reference_matmul_f32
from opgen.codegen.resolve import as_spec
from opgen.codegen.tolerance import output_error, tolerance
from opgen.runtime.arrays import ACCEPT
from opgen.runtime.device import NoGPUError, has_gpu
from opgen.runtime.op import load_linear, quantize_spec
from opgen.runtime import tuning_db as tdb
from opgen.runtime.tuning_db import make_key
from opgen.runtime.tiled import out_dtype, out_to_f32, poison


def test_load_without_gpu_says_so():
    if has_gpu():
        pytest.skip("a GPU is present")
    with pytest.raises(NoGPUError, match="opgen build"):
        opgen.load("gptq_v2_w4a16_g128", N=1024, K=1024)


def test_the_fused_linear_quantizes_to_the_spec_activation():
    q = quantize_spec(as_spec("w8a8_int8"))
    assert q.op == "quantize" and q.a.dtype == "float16" and q.out.dtype == "int8"
    assert q.name == "quantize_int8_float16"
    assert quantize_spec(as_spec("fp8_e4m3_w8a8"), "bfloat16").name == "quantize_float8_e4m3_bfloat16"


# --- on the GPU ----------------------------------------------------------------------------

def poisoned_out(spec, M, N):
    """An op's out= [M, N] full of the workbench's poison (NaN): an output
    the kernel leaves unwritten fails the check, where a fresh allocation
    may hold an earlier call's right answer."""
    import cupy as cp
    return cp.full((M, N), poison(spec), dtype=out_dtype(spec))


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_dispatch_and_errors():
    import cupy as cp
    spec = as_spec("gptq_v2_w4a16_g128")
    N, K = 1024, 2048
    rng = np.random.default_rng(3)
    w = random_weight_tensors(spec, N, K, rng)
    dev = {k: cp.asarray(v) for k, v in w.items()}
    op = opgen.load(spec, N=N, K=K, use_db=False)
    stored = opgen.load(spec, N=N, K=K, use_db=False, layout="stored")
    prepared = op.prepare(dev["qweight"], dev["scales"], dev["zeros"])
    for M in (1, 7, 64, 300):
        a, _ = random_activation(spec, M, K, rng)
        ref = reference_matmul_f32(spec, a, w)
        for o, args in ((op, (prepared,)), (stored, (dev["qweight"], dev["scales"], dev["zeros"]))):
            out = o(cp.asarray(a), *args, out=poisoned_out(spec, M, N))
            err = output_error(spec, out.get().astype(np.float64), ref)
            assert err <= tolerance(spec), (M, o.kernel_spec.name, o.config_for(M).name, err)
    assert op.config_for(1).family == "gemv" and op.config_for(300).family == "gemm"
    a = cp.asarray(random_activation(spec, 4, K, rng)[0])
    with pytest.raises(UserError, match="prepare the weight once"):
        op(a, dev["qweight"], dev["scales"], dev["zeros"])
    with pytest.raises(ValueError, match="qweight: shape"):
        stored(a, dev["qweight"][:-8], dev["scales"], dev["zeros"])
    with pytest.raises(ValueError, match="scales: dtype"):
        stored(a, dev["qweight"], dev["scales"].astype(cp.float32), dev["zeros"])
    with pytest.raises(ValueError, match="zeros: required"):
        stored(a, dev["qweight"], dev["scales"])
    with pytest.raises(ValueError, match="a: shape"):
        op(a[:, :-32], prepared)
    with pytest.raises(ValueError, match="a_scale: spec gptq_v2_w4a16_g128_exec has float16 activations"):
        op(a, prepared, a_scale=cp.ones(4, cp.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gptq_v1_w4a16_g128", "awq_w4a16_g128"])
def test_prepare_on_the_gpu_equals_numpy_and_runs(name):
    """CuPy in: the move runs on the GPU and gives numpy's bytes; the
    prepared weight computes the spec's matmul at odd sizes."""
    import cupy as cp
    spec = as_spec(name)
    N, K = 288, 640            # 9 x 32 rows (AWQ's 16-byte rows), 5 groups
    rng = np.random.default_rng(11)
    w = random_weight_tensors(spec, N, K, rng)
    op = opgen.load(spec, N=N, K=K, use_db=False)
    on_gpu = op.prepare(*(cp.asarray(w[k]) for k in ("qweight", "scales", "zeros")))
    on_cpu = op.prepare(w["qweight"], w["scales"], w["zeros"])
    for k, v in on_cpu.tensors.items():
        assert np.array_equal(on_gpu.tensors[k].get(), v), k
    for M in (1, 13, 77):
        a, _ = random_activation(spec, M, K, rng)
        out = op(cp.asarray(a), on_gpu, out=poisoned_out(spec, M, N))
        ref = reference_matmul_f32(spec, a, w)
        err = output_error(spec, out.get().astype(np.float64), ref)
        assert err <= tolerance(spec), (M, op.config_for(M).name, err)


@pytest.mark.gpu
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
    err = output_error(spec, out.cpu().numpy().astype(np.float64), ref)
    assert err <= tolerance(spec)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w8a8_int8", "fp8_e4m3_w8a8", "w4a8_int8_g128", "w4a8_fp8", "bitnet_b158_a8"])
@pytest.mark.parametrize("M", [1, 16, 100, 256])
def test_fused_w8a8_linear(name, M):
    """quantize(x) -> int8/fp8 GEMM with both scales fused == the reference
    pipeline (reference quantize, then the reference matmul); with sub-byte
    weights too (their zero points where the spec has them)."""
    import cupy as cp
    spec = as_spec(name)
    N, K = 2048, 4096
    rng = np.random.default_rng(M)
    w = random_weight_tensors(spec, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float16)
    op = load_linear(spec, N=N, K=K, use_db=False)
    out = op(cp.asarray(x), *[cp.asarray(w[k]) for k in ("qweight", "scales", "zeros") if k in w],
             out=poisoned_out(spec, M, N))
    codes, a_scale = quantize_activation(spec, x)
    ref = reference_matmul_f32(spec, codes, w, a_scale=a_scale)
    got = out_to_f32(spec, out.get())
    err = output_error(spec, got.astype(np.float64), ref)
    assert err <= tolerance(spec), err


# --- what needs no GPU: argument checks before anything runs -------------------------------

def test_an_unknown_arch_is_refused_with_the_known_ones():
    with pytest.raises(UserError, match="unknown arch 'banana'.*sm_90"):
        opgen.load("w4a16_sym_g128", N=4096, K=4096, arch="banana")
    with pytest.raises(UserError, match="unknown arch"):
        opgen.load("quantize_int8_row", K=4096, arch="banana")


@pytest.mark.parametrize("K", [0, -8, 12])
def test_quantize_op_needs_a_positive_multiple_of_8(K):
    with pytest.raises(UserError, match=f"K={K} must be a positive multiple of 8"):
        opgen.load("quantize_int8_row", K=K, arch="sm_90")


def test_the_op_runs_the_execution_layout_and_prepare_moves_the_weight():
    """AWQ packs along n, its kernels read codes packed along k: the op runs
    the execution spec, and prepare (numpy here) moves a weight there
    bit-exactly; raw stored tensors are refused, never guessed."""
    spec = as_spec("awq_w4a16_g128")
    N, K = 96, 256
    op = opgen.load(spec, N=N, K=K, arch="sm_90")
    assert op.kernel_spec.name == "awq_w4a16_g128_exec" and op.spec is spec
    assert planner.execution_spec(op.kernel_spec, "sm_90") is op.kernel_spec
    w = random_weight_tensors(spec, N, K, np.random.default_rng(1))
    p = op.prepare(w["qweight"], w["scales"], w["zeros"])
    assert p.spec is op.kernel_spec and p.tensors["qweight"].shape == (N, K // 8)
    assert np.array_equal(dequantize(p.spec, p.tensors, N, K), dequantize(spec, w, N, K))
    with pytest.raises(UserError, match=r"op\.prepare\(qweight, scales, zeros\)"):
        op(np.zeros((1, K), np.float16), w["qweight"], w["scales"], w["zeros"])
    other = opgen.load(spec, N=N, K=2 * K, arch="sm_90")
    with pytest.raises(ValueError, match=f"prepared for awq_w4a16_g128_exec {N}x{K}"):
        other._weights(p, None, None)
    with pytest.raises(ValueError, match="pass it alone"):
        op._weights(p, w["scales"], None)
    kept = opgen.load(spec, N=N, K=K, arch="sm_90", layout="stored")
    assert kept.kernel_spec is spec and kept.prepare(w["qweight"]).tensors["qweight"] is w["qweight"]
    with pytest.raises(UserError, match="layout: 'fast'"):
        opgen.load(spec, N=N, K=K, arch="sm_90", layout="fast")


def test_prepare_takes_torch_tensors_and_gives_them_back():
    torch = pytest.importorskip("torch")
    spec = as_spec("gptq_v1_w4a16_g128")
    N, K = 64, 256
    w = random_weight_tensors(spec, N, K, np.random.default_rng(2))
    op = opgen.load(spec, N=N, K=K, arch="sm_90")
    p = op.prepare(*(torch.from_numpy(w[k]) for k in ("qweight", "scales", "zeros")))
    assert all(isinstance(v, torch.Tensor) for v in p.tensors.values())
    assert p.tensors["scales"].dtype == torch.float16 and p.tensors["qweight"].dtype == torch.int32
    want = op.prepare(w["qweight"], w["scales"], w["zeros"]).tensors
    assert all(np.array_equal(p.tensors[k].numpy(), want[k]) for k in want)


def test_config_for_needs_no_gpu_and_loading_a_kernel_says_no_gpu():
    op = opgen.load("w4a16_sym_g128", N=4096, K=4096, arch="sm_90")
    assert op.config_for(16).name and op.sources["9-16"] in ("db", "heuristic")
    if has_gpu():
        pytest.skip("a GPU is present")
    with pytest.raises(NoGPUError):
        op.kernel_for(16)


def test_fp8_weights_are_checked_as_fp8():
    """An fp8 qweight may come as float8_e4m3fn (torch) or as its uint8 bits."""
    op = opgen.load("fp8_e4m3_w8a16", N=4096, K=4096, arch="sm_90")
    assert op._dtypes["qweight"] == "float8_e4m3"
    assert {"float8_e4m3fn", "uint8"} <= set(ACCEPT[op._dtypes["qweight"]])


def test_a_tuned_config_that_does_not_compile_falls_back_to_the_heuristic(monkeypatch):
    # the shipped H200 record of this shape, looked up as on an H200
    monkeypatch.setattr("opgen.runtime.op.make_key",
                        lambda spec, N, K, arch: make_key(spec, N, K, arch=arch, device="NVIDIA H200"))
    op = opgen.load("w4a16_sym_g128", N=8192, K=8192, arch="sm_90")
    # a bucket whose tuned winner is not the heuristic's pick
    bucket, M = next((b, M) for b, M in (("1", 1), ("2-4", 4), ("9-16", 16), ("17-32", 32), ("33-64", 64),
                                         ("65-128", 128), ("129-256", 256), ("257-512", 512),
                                         ("513-1024", 1024), (">1024", 4096))
                     if op.choose(b) != op.choose(b, from_db=False))
    tuned = op.choose(bucket)
    assert op.sources[bucket] == "db"
    heur = op.choose(bucket, from_db=False)
    made = []

    def fake_kernel(spec, cfg, arch, pdl=False):
        if cfg == tuned:
            raise CompileError("NVRTC failed for it (sm_90):\nerror: something new")
        made.append(cfg)
        return cfg
    monkeypatch.setattr("opgen.runtime.op.Kernel", fake_kernel)
    with pytest.warns(UserWarning, match="does not compile here"):
        assert op.kernel_for(M) == heur
    assert made == [heur]


def test_the_db_may_be_given_as_a_path_and_a_broken_record_is_said(tmp_path, monkeypatch):
    spec, N, K = as_spec("w4a16_sym_g128"), 1024, 2048
    monkeypatch.setattr("opgen.runtime.op.make_key",
                        lambda spec, N, K, arch: make_key(spec, N, K, arch=arch, device="NVIDIA H200"))
    key = make_key(planner.execution_spec(spec, "sm_90"), N, K, arch="sm_90", device="NVIDIA H200")
    op = opgen.load(spec, N=N, K=K, arch="sm_90", use_db=False)
    cfg = op.choose("9-16")                 # M = 16's pick, stored for M = 1: it must come back
    path = tmp_path / "db.json"
    tdb.TuningDB(path, shipped=False).put(
        key, "1", dict(config=cfg.to_dict(), median_us=1.0, source_hash=tdb.rendered_hash(key, cfg.to_dict())))
    op = opgen.load(spec, N=N, K=K, arch="sm_90", db=str(path))
    assert op.config_for(1) == cfg and op.sources["1"] == "db"
    # A lookup that fails (here: a config that is not a dict): the heuristic's pick, said.
    monkeypatch.setattr(tdb.TuningDB, "lookup", lambda *a: {"config": ["not", "a", "dict"]})
    with pytest.warns(RuntimeWarning, match=r"M bucket 2-4 is unusable"):
        assert op.config_for(4) == op.choose("2-4", from_db=False)
    with pytest.raises(TypeError, match="db: a TuningDB or the path"):
        opgen.load(spec, N=N, K=K, arch="sm_90", db=3)


@pytest.mark.parametrize("kw,match", [
    (dict(N=4096.7, K=4096), r"N=4096\.7 must be an integer"),     # was truncated to 4096
    (dict(N=4096, K=4096.0), r"K=4096\.0 must be an integer"),
    (dict(N=4096, K=2 ** 31), r"K=2147483648 is out of range .*32-bit int"),
    (dict(N=2 ** 64 + 1, K=4096), r"N=18446744073709551617 is out of range"),
])
def test_load_refuses_sizes_it_would_truncate_or_overflow(kw, match):
    with pytest.raises(UserError, match=match):
        opgen.load("w4a16_sym_g128", arch="sm_90", **kw)


def test_load_takes_numpy_integer_sizes():
    op = opgen.load("w4a16_sym_g128", N=np.int64(4096), K=np.int32(4096), arch="sm_90")
    assert (op.N, op.K) == (4096, 4096) and (type(op.N), type(op.K)) == (int, int)


@pytest.mark.parametrize("K,match", [(4096.7, r"K=4096\.7 must be an integer"),
                                     (2 ** 31, "K=2147483648 is out of range")])
def test_quantize_op_refuses_sizes_it_would_truncate_or_overflow(K, match):
    with pytest.raises(UserError, match=match):
        opgen.load("quantize_int8_row", K=K, arch="sm_90")


def test_without_a_record_the_op_runs_the_pick_that_does_not_spill():
    op = opgen.load("w4a16_sym_g128", N=4096, K=4096, arch="sm_90", use_db=False)
    first = op.choose("1", compiled=False)
    assert first == planner.heuristic(op.spec, "sm_90", 1, 4096, 4096)
    assert op.config_for(1) == default_config(op.spec, "sm_90", 1, 4096, 4096) != first

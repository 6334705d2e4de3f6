"""Compiled kernels loaded and launched (runtime/kernel.py). On the CPU: the
launch's argument values in the declared order (codegen/kernel_args.py),
and the same values through the driver's launch for PDL (runtime/pdl.py).
On the GPU (gpu mark): every shipped matmul spec, every kernel family,
several configurations: GPU output vs the numpy reference on fresh random
data, output poisoned first (runtime.workbench.full_check), held to the one
tolerance policy (codegen/tolerance.py: ||out - ref|| / ||ref|| against the
fp32 reference, from the dtypes the kernel rounds through).
"""
import ctypes
import functools
import os
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from opgen.codegen import compiler, hw, planner, render
from opgen.codegen.compiler import compile_many
from opgen.codegen.kernel_args import ARGUMENTS, TMA_ARGUMENTS
from opgen.codegen.lower import numerics, weight_layout
from opgen.codegen.random_data import random_activation, random_weight_tensors
from opgen.codegen.reference import dequantize, reference_matmul_f32
from opgen.codegen.tolerance import output_error, tolerance
from opgen.codegen.resolve import load_spec, shipped_specs
from opgen.codegen.spec import A8_DTYPES
from opgen.codegen.validate import spec_from_dict
from opgen.runtime import kernel, pdl, tiled, tma, workbench
from opgen.runtime.device import current_arch
from opgen.runtime.kernel import Kernel
from pdl_fakes import FakeDriver
from strategies import runnable_shape, valid_spec_dicts

MATMUL_SPECS = sorted(n for n, p in shipped_specs().items() if load_spec(p).op == "matmul")
# ... and, as "<name>@exec", the execution specs that differ from the stored
# form (opgen.load runs those; layout="stored" the stored form)
RUN_SPECS = MATMUL_SPECS + [n + "@exec" for n in MATMUL_SPECS
                            if planner.execution_spec(load_spec(shipped_specs()[n]), "sm_90")
                            != load_spec(shipped_specs()[n])]


def run_spec(name):
    """A RUN_SPECS entry's spec."""
    base, _, exe = name.partition("@")
    spec = load_spec(shipped_specs()[base])
    return planner.execution_spec(spec, "sm_90") if exe else spec


@functools.lru_cache(maxsize=48)
def weights(spec, N, K):
    """Random weights per (spec, shape) and their dequantized float32 value,
    shared by the M values of one shape (each costs seconds in numpy; all of
    them together fit in host memory, ~7 GB)."""
    t = random_weight_tensors(spec, N, K, np.random.default_rng(N * 7 + K))
    return t, dequantize(spec, t, N, K)


@functools.lru_cache(maxsize=1)
def session():
    return workbench.Session(current_arch())


def run_check(spec, cfg, M, N, K, seed, record=None):
    err, finite = workbench.full_check(session(), spec, Kernel(spec, cfg), M, N, K,
                                       np.random.default_rng(seed), weights=weights(spec, N, K))
    if record is not None:
        record(spec=spec.name, config=cfg.name, M=M, N=N, K=K, rel_err=err, finite=finite,
               tol=tolerance(spec), ok=finite and err <= tolerance(spec))
    assert finite, f"{spec.name} {cfg.name} M={M} N={N} K={K}: unwritten or non-finite outputs"
    assert err <= tolerance(spec), f"{spec.name} {cfg.name} M={M} N={N} K={K}: rel err {err:.2e}"


def configs_for(spec, arch, M, N, K, limit=3):
    """The heuristic pick plus a spread of other valid configs."""
    cands = planner.candidates(spec, arch, M, N, K)
    pick = [planner.heuristic(spec, arch, M, N, K)]
    rest = [c for c in cands if c != pick[0]]
    step = max(1, len(rest) // max(1, limit - 1))
    return pick + rest[::step][: limit - 1]


# OPGEN_GPU_MS="16,33" runs a subset (e.g. to resume a run cut short).
MS = [int(m) for m in os.environ.get("OPGEN_GPU_MS", "1,3,16,33,128,1000").split(",")]


# OPGEN_GPU_SHAPES=square and OPGEN_GPU_CONFIGS=1 shorten a run (the numpy
# reference of the large shapes costs seconds per check).
SQUARE_ONLY = os.environ.get("OPGEN_GPU_SHAPES") == "square"
N_CONFIGS = int(os.environ.get("OPGEN_GPU_CONFIGS", "2"))


def shapes_for(M):
    """All three LLM shapes for decode sizes, the square one for the rest."""
    return [(4096, 4096), (11008, 4096), (4096, 11008)][: (3 if M <= 3 and not SQUARE_ONLY else 1)]


@pytest.fixture(autouse=True)
def precompiled(request):
    """Before the first GPU test: every kernel this module launches,
    compiled on all cores up front."""
    if request.node.get_closest_marker("gpu"):
        _precompile()


@functools.lru_cache(maxsize=1)
def _precompile():
    arch = current_arch()
    jobs = {(load_spec(shipped_specs()[n]), cfg, arch)
            for n in MATMUL_SPECS for M in MS for (N, K) in shapes_for(M)
            for cfg in configs_for(load_spec(shipped_specs()[n]), arch, M, N, K, limit=N_CONFIGS)}
    for _ in compile_many(jobs):
        pass


# --- on the CPU ----------------------------------------------------------------------------

def test_launch_values_follow_the_declared_arguments():
    """The launcher passes the kernels' arguments in the declared order: ints
    as ints, pointers as pointers (absent or None: null), tensor maps as they
    are."""
    ptr, num = (lambda v: ("ptr", v)), (lambda v: ("int", v))
    values = dict(a=11, b=12, s=13, z=None, out=14, ws=15, counters=16, M=1, N=2, K=3)
    assert kernel._values(kernel._converters(ARGUMENTS, ptr, num), values) == [
        ("ptr", 11), ("ptr", 0), ("ptr", 12), ("ptr", 13), ("ptr", 0), ("ptr", 0), ("ptr", 14),
        ("ptr", 15), ("ptr", 16), ("int", 1), ("int", 2), ("int", 3)]
    maps = dict(tmA=object(), tmB=object())
    got = kernel._values(kernel._converters(TMA_ARGUMENTS, ptr, num), dict(values, **maps))
    assert got[:2] == [maps["tmA"], maps["tmB"]]
    assert got[2:] == [("ptr", 0), ("ptr", 13), ("ptr", 0), ("ptr", 0), ("ptr", 14), ("ptr", 15),
                       ("ptr", 16), ("int", 1), ("int", 2), ("int", 3)]
    assert [n for n, _ in kernel._PLAIN_ARGS] == [a.name for a in ARGUMENTS]
    assert [n for n, _ in kernel._TMA_ARGS] == [a.name for a in TMA_ARGUMENTS]


class _FakeFn:
    """A loaded function: its address, and its CuPy-style launches recorded."""
    ptr = 0xF00

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem, stream):
        self.calls.append((grid, block, [int(a) for a in args], shared_mem, stream.ptr))


def _read_params(args):
    """Reads a kernelParams array of the kernel's arguments `args` (tensor
    maps as their 128 bytes, ints and pointers as ints)."""
    def read(ptr):
        slots = (ctypes.c_void_p * len(args)).from_address(ptr)
        ctype = {"int": ctypes.c_int32}
        return [bytes((ctypes.c_char * 128).from_address(addr)) if a.ctype.endswith("CUtensorMap")
                else ctype.get(a.ctype, ctypes.c_uint64).from_address(addr).value
                for a, addr in zip(args, slots)]
    return read


@pytest.mark.parametrize("family", ["gemv", "tma"])
def test_pdl_launch_passes_the_values_of_a_plain_launch(family, monkeypatch):
    """Kernel(pdl=True) compiles its kernel with pdl and launches it through
    pdl.launch_ex with the argument values, grid, block, shared memory and
    stream of the launch without it (CuPy's, or tma.launch's)."""
    spec = load_spec(shipped_specs()["w4a16_sym_g128"])
    M, N, K = (1, 4096, 4096) if family == "gemv" else (70, 1024, 1024)
    cfg = (planner.heuristic(spec, "sm_90", M, N, K) if family == "gemv" else
           next(c for c in planner.candidates(spec, "sm_90", M, N, K) if c.tma and c.split_k == 1))
    compiled = []

    def fake_compile(s, c, arch, pdl=False):
        compiled.append(pdl)
        return compiler.Compiled(b"", render.kernel_name(s, c), "", "", planner.plan(s, c, arch), arch)

    monkeypatch.setattr(compiler, "compile_kernel", fake_compile)
    monkeypatch.setattr(kernel, "load_function", lambda c: (None, _FakeFn()))
    monkeypatch.setattr(tma, "encode_2d", lambda ptr, *a, **kw: tma.TensorMap(*([ptr] * 16)))
    tma_calls = []
    monkeypatch.setattr(tma, "launch", lambda fn, grid, threads, smem, stream_ptr, args: tma_calls.append(
        (grid, (threads, 1, 1), [bytes(a) if isinstance(a, tma.TensorMap) else a.value for a in args],
         smem, stream_ptr)))
    args = TMA_ARGUMENTS if cfg.tma else ARGUMENTS
    drv = FakeDriver(read=_read_params(args))
    monkeypatch.setattr(pdl, "_driver", lambda: drv)
    stream = type("Stream", (), {"ptr": 0x5EA})()
    ptrs = dict(a=0x1000, b=0x2000, s=0x3000, out=0x4000)
    plain, with_pdl = Kernel(spec, cfg, "sm_90"), Kernel(spec, cfg, "sm_90", pdl=True)
    assert compiled == [False, True]
    plain.launch(ptrs, M, N, K, stream)
    with_pdl.launch(ptrs, M, N, K, stream)
    (want,) = tma_calls if cfg.tma else plain.fn.calls
    (got,) = drv.calls
    assert got.pop("attrs") == [(pdl.PROGRAMMATIC_STREAM_SERIALIZATION, 1)]
    assert (got["grid"], got["block"], got["values"], got["smem"], got["stream"]) == want
    assert got["fn"] == _FakeFn.ptr and not with_pdl.fn.calls


def test_pdl_quantize_launch(monkeypatch):
    """QuantizeKernel(pdl=True): compiled with pdl, launched through pdl.launch_ex
    with x, codes, scale, M, K."""
    spec = load_spec(shipped_specs()["quantize_int8_row"])
    monkeypatch.setattr(compiler, "compile_kernel", lambda s, c, arch, pdl=False: compiler.Compiled(
        b"", "q", "", "", planner.quantize_plan(arch), arch) if pdl else pytest.fail("compiled without pdl"))
    monkeypatch.setattr(kernel, "load_function", lambda c: (None, _FakeFn()))
    drv = FakeDriver(read=lambda ptr: [ctypes.c_uint64.from_address(a).value if i < 3 else
                                       ctypes.c_int32.from_address(a).value
                                       for i, a in enumerate((ctypes.c_void_p * 5).from_address(ptr))])
    monkeypatch.setattr(pdl, "_driver", lambda: drv)
    q = kernel.QuantizeKernel(spec, "sm_90", pdl=True)
    q.launch(0x10, 0x20, 0x30, 5, 4096, type("Stream", (), {"ptr": 0x5EA})())
    (got,) = drv.calls
    assert got["values"] == [0x10, 0x20, 0x30, 5, 4096] and got["stream"] == 0x5EA
    assert got["grid"] == tuple(q.compiled.plan.grid(5, 0)) and got["attrs"] == [(6, 1)]


def test_the_gpu_tests_lists_hold_what_sm_90a_offers():
    """The GPU tests' spec lists below come from the planner's sm_90a
    candidates at import: each still holds the specs it held when pinned (a
    kind the planner stopped offering a spec would drop the spec from its
    test silently, an empty list the whole test)."""
    a16_decoded = {"bitnet_b158", "bnb_nf4", "fp8_e4m3_w8a16", "gptq_v1_w4a16_g128",
                   "gptq_v1_w4a16_g128_repacked", "gptq_v2_w4a16_g128",
                   "gptq_v2_w4a16_g128_repacked", "mxfp4", "w1a16_g128", "w2a16_g128",
                   "w4a16_sym_g128"}
    a8 = {"bitnet_b158_a8", "fp8_e4m3_w8a8", "int8_int4_int32", "w4a8_fp8", "w4a8_int8",
          "w4a8_int8_g128", "w8a8_int8"}
    assert a16_decoded | {"bitnet_b158_a8", "fp16", "fp8_e4m3_w8a8", "w4a8_int8",
                          "w8a8_int8"} <= set(TMA_SPECS)
    assert a16_decoded | a8 - {"fp8_e4m3_w8a8", "w8a8_int8"} | {"awq_w4a16_g128"} <= set(RS_SPECS)
    assert {"bnb_nf4", "mxfp4"} <= set(PAIR_TABLE_SPECS)
    assert {"fp8_e4m3_w8a8"} <= set(INFLIGHT_SUMS_SPECS)
    assert a8 <= set(A8_GEMV_SPECS)
    assert a16_decoded | {"awq_w4a16_g128", "bitnet_b158_a8", "w4a8_int8"} <= set(PREDECODE_SPECS)


# --- on the GPU ----------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", RUN_SPECS)
@pytest.mark.parametrize("M", MS)
def test_spec_matches_reference(name, M, record):
    spec = run_spec(name)
    arch = current_arch()
    for (N, K) in shapes_for(M):
        for i, cfg in enumerate(configs_for(spec, arch, M, N, K, limit=N_CONFIGS)):
            run_check(spec, cfg, M, N, K, seed=1000 * M + i, record=record)


@pytest.mark.gpu
@pytest.mark.parametrize("name", RUN_SPECS)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_odd_shapes(name, data, record):
    """Odd M and the smallest N, K the alignment rules allow, any valid config."""
    spec = run_spec(name)
    arch = current_arch()
    M = data.draw(st.integers(1, 300), label="M")
    N = data.draw(st.sampled_from([8, 24, 40, 136, 264, 520, 544]), label="N")
    K = data.draw(st.sampled_from([128, 256, 384, 640, 1152]), label="K")
    try:
        cands = planner.candidates(spec, arch, M, N, K)
    except planner.PlanError:
        cands = []  # shape refused with the alignment rule (tested on the CPU)
    assume(cands)   # (a draw refused is not a pass: hypothesis draws another)
    cfg = data.draw(st.sampled_from(cands), label="config")
    run_check(spec, cfg, M, N, K, seed=data.draw(st.integers(0, 2**31)), record=record)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 200])
def test_fp8_activation_fallback(M, monkeypatch, record):
    """The path sm_80/86 take for fp8 activations (widened to fp16 in shared
    memory, f16 mma), forced on this GPU by hiding its e4m3 mma, and its
    wgmma and TMA as sm_80/86 have neither (with them the planner would take
    a wgmma kernel at M = 200, which is not that path)."""
    arch = current_arch()
    monkeypatch.setitem(hw.ARCHS, arch, replace(hw.ARCHS[arch], fp8_mma=False, wgmma=False, tma=False))
    spec = load_spec(shipped_specs()["fp8_e4m3_w8a8"])
    cfg = planner.heuristic(spec, arch, M, 4096, 4096)
    assert planner.geometry(spec, cfg, arch)["a_decode"]
    run_check(spec, cfg, M, 4096, 4096, seed=M, record=record)


@pytest.mark.gpu
@settings(max_examples=int(os.environ.get("OPGEN_GPU_SPECS", "40")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(d=valid_spec_dicts(), M=st.sampled_from([1, 5, 16, 70]), data=st.data())
def test_generated_specs_match_reference(d, M, data, record):
    """Any valid spec the planner accepts, as opgen.load runs it (its execution
    spec): a random candidate config against the reference (formats,
    packings, orders, zero kinds, epilogues beyond the shipped set)."""
    spec = spec_from_dict(d)
    assume(spec.op == "matmul" and runnable_shape(spec) is not None)   # (not a pass: redrawn)
    spec = planner.execution_spec(spec, current_arch())
    N, K = runnable_shape(spec)
    try:
        cands = planner.candidates(spec, current_arch(), M, N, K)
    except planner.PlanError:
        cands = []   # refused with its reason (tests/codegen/test_compiler.py)
    assume(cands)
    cfg = data.draw(st.sampled_from(cands), label="config")
    run_check(spec, cfg, M, N, K, seed=data.draw(st.integers(0, 2**31)), record=record)


WGMMA_SPECS = [n for n in MATMUL_SPECS if n != "awq_w4a16_g128"]   # K-major weights


def skip_without(feature):
    """Skip on a GPU whose arch lacks `feature` (hw.Arch.wgmma / tma, sm_90a's):
    only there may a test's configs of that kind be missing (elsewhere an
    empty list fails, not skips)."""
    arch = current_arch()
    if not getattr(hw.arch(arch), feature):
        pytest.skip(f"no {feature} on {arch}")


def check_all(spec, cfgs, M, N, K, record):
    """run_check for each config, compiled first on all cores."""
    for _ in compile_many({(spec, c, current_arch()) for c in cfgs}):
        pass
    for i, cfg in enumerate(cfgs):
        run_check(spec, cfg, M, N, K, seed=i, record=record)


@pytest.mark.gpu
@pytest.mark.parametrize("name", WGMMA_SPECS)
@pytest.mark.parametrize("M,N,K", [(70, 264, 1152), (200, 4096, 4096)])
def test_wgmma_matches_reference(name, M, N, K, record):
    """Every wgmma tile shape (sm_90a) at an odd M and at N not a multiple of
    the tile (tails), one stage count and split each, against the reference."""
    skip_without("wgmma")
    spec = load_spec(shipped_specs()[name])
    one_each = {}      # (tile, split) -> its first config
    for c in planner.candidates(spec, current_arch(), M, N, K):
        if c.wgmma:
            one_each.setdefault((c.BM, c.BN, c.WN, c.split_k), c)
    assert one_each
    check_all(spec, list(one_each.values()), M, N, K, record)


def tma_configs(spec, arch, M, N, K):
    """The TMA GEMM's configs (the rs GEMM's, TMA too, have their own test)."""
    return [c for c in planner.candidates(spec, arch, M, N, K) if c.tma and not c.rs]


def _dense(name):
    return numerics(load_spec(shipped_specs()[name])).dense


# K = 2080: a partial last k-tile of 8-bit operands; decoded weights (groups of
# 32-128) take 2176 = 34 k-tiles of 64. The shapes where sm_90a has TMA GEMM
# configs (not every spec at both: 1-bit codes from M = 300 only).
TMA_CASES = [(n, *shape) for n in WGMMA_SPECS
             for shape in ((70, 264, 1152), (300, 1032, 2080 if _dense(n) else 2176))
             if tma_configs(load_spec(shipped_specs()[n]), "sm_90", *shape)]
TMA_SPECS = sorted({n for n, *_ in TMA_CASES})


@pytest.mark.gpu
@pytest.mark.parametrize("name,M,N,K", TMA_CASES)
def test_tma_matches_reference(name, M, N, K, record):
    """Every tma config (tile, ring depth, cluster; for GPTQ the predecode
    pair; for weights stored [N, K] that need decoding, the producer
    warpgroup's decode) at tails in M, N (not a multiple of the tile) and K,
    which TMA fills with zeros."""
    skip_without("tma")
    spec = load_spec(shipped_specs()[name])
    cfgs = tma_configs(spec, current_arch(), M, N, K)
    assert cfgs
    check_all(spec, cfgs, M, N, K, record)


def _run_spec(name):
    """The spec opgen.load runs for a shipped spec on sm_90 (its execution spec)."""
    return planner.execution_spec(load_spec(shipped_specs()[name]), "sm_90")


# Specs whose wgmma sums lose precision over K (hw.Wgmma.exact_acc: fp8).
INEXACT_WGMMA_SPECS = [n for n in MATMUL_SPECS if not hw.WGMMAS[numerics(_run_spec(n)).mma].exact_acc]


@pytest.mark.gpu
@pytest.mark.parametrize("name", INEXACT_WGMMA_SPECS)
def test_long_k_wgmma_matches_reference(name, record):
    """At K = 57344 one wgmma config of each tile and kind meets the tolerance
    it meets at K = 1152: each k-tile's sums are added up in fp32
    (planner.gemm.wgmma_promotes). Summed on the tensor cores alone,
    fp8_e4m3_w8a8 measured 1.9e-2 at this K against 8.8e-3 allowed."""
    skip_without("wgmma")
    spec = _run_spec(name)
    M, N, K = 70, 264, 57344
    one_each = {}
    for c in planner.candidates(spec, current_arch(), M, N, K):
        if c.wgmma:
            one_each.setdefault((c.BM, c.BN, c.WN, c.tma, c.predecode, c.split_k), c)
    assert one_each
    check_all(spec, list(one_each.values()), M, N, K, record)


INFLIGHT_SUMS_SPECS = [n for n in INEXACT_WGMMA_SPECS
                       if any(c.inflight_sums for c in planner.candidates(_run_spec(n), "sm_90", 300, 1032, 2048))]


@pytest.mark.gpu
@pytest.mark.parametrize("name", INFLIGHT_SUMS_SPECS)
@pytest.mark.parametrize("M,N,K", [(70, 264, 1024), (300, 1032, 2080)])
def test_inflight_sums_equal_the_one_set_kernel(name, M, N, K, record):
    """The TMA GEMM's in-flight sums (Config.inflight_sums: two k-tiles
    issued, each one's sums added as it is done) add the same tile sums in the
    same order as the one-set kernel: the outputs are equal bit for bit, at an
    even (8) and an odd, partial (17) count of k-tiles, and within the
    reference's tolerance. hw.Calibration.inflight_sums_verified waits for
    this and a timing."""
    skip_without("tma")
    spec = _run_spec(name)
    cfgs = [c for c in planner.candidates(spec, current_arch(), M, N, K) if c.inflight_sums]
    assert cfgs
    check_twins(spec, [(c, replace(c, inflight_sums=False)) for c in cfgs], M, N, K, record)


def check_twins(spec, pairs, M, N, K, record):
    """For each (config, twin) pair (twin None: none to compare with), on
    the same random problem: the config's output equal to its twin's bit for
    bit, and within the reference's tolerance (output poisoned before each
    launch)."""
    for _ in compile_many({(spec, c, current_arch()) for pair in pairs for c in pair if c is not None}):
        pass
    rng = np.random.default_rng(M + K)
    tensors, _ = weights(spec, N, K)
    a, a_scale = random_activation(spec, M, K, rng)
    sess = session()
    dev = sess.to_device
    for i, (c, twin) in enumerate(pairs):
        if twin is not None:
            outs = []
            for cfg in (c, twin):
                out = sess.xp.full((M, N), tiled.poison(spec), dtype=tiled.out_dtype(spec))
                Kernel(spec, cfg)(dev(a), {k: dev(v) for k, v in tensors.items()}, out, a_scale=dev(a_scale))
                sess.synchronize()
                outs.append(sess.to_host(out))
            assert np.array_equal(outs[0].view(np.uint8), outs[1].view(np.uint8)), f"{c.name} differs from {twin.name}"
        run_check(spec, c, M, N, K, seed=i, record=record)


RS_SPECS = [n for n in MATMUL_SPECS
            if any(c.rs for c in planner.candidates(_run_spec(n), "sm_90", 70, 1024, 1024))]


@pytest.mark.gpu
@pytest.mark.parametrize("name", RS_SPECS)
@pytest.mark.parametrize("M,N,K", [(13, 264, 1152), (70, 264, 1152), (300, 1032, 2176)])
def test_rs_matches_reference(name, M, N, K, record):
    """Every config of the rs GEMM (weights decoded into wgmma's register
    operand; m-tile = wgmma N, k-tile depth, ring depth, k-groups, the
    setmaxnreg split) at tails: M inside one 16-row tile (the tuner takes it
    from M = 9) and past several, N past the 64 / 128 weight rows of a block
    (rows and scales past N), K = 18 and 34 64-deep k-tiles (9 and 17 of
    128: k-groups of unequal length). In the layout opgen.load runs: GPTQ,
    AWQ, 2-bit, ternary and 1-bit codes moved into their execution layouts
    (interleaved int32 words); NF4 (the table), float32 scales converted."""
    skip_without("wgmma")
    spec = _run_spec(name)
    cfgs = [c for c in planner.candidates(spec, current_arch(), M, N, K) if c.rs]
    assert cfgs
    check_all(spec, cfgs, M, N, K, record)


@pytest.mark.gpu
def test_rs_scale_words_at_k_not_a_multiple_of_the_tile(record):
    """MXFP4's rs GEMM loads a row's e8m0 scales of a k-tile as one word,
    so it runs only where K is a multiple of the tile (planner.rs.shape_ok):
    at K = 1088 (17 64-deep tiles, 8.5 128-deep ones) every 64-deep config
    matches the reference, and a 128-deep one, forced, refuses the launch
    rather than reading another row's scales."""
    skip_without("wgmma")
    spec = _run_spec("mxfp4")
    M, N, K = 13, 264, 1088
    cfgs = [c for c in planner.candidates(spec, current_arch(), M, N, K) if c.rs]
    assert cfgs and {c.BK for c in cfgs} == {64}
    check_all(spec, cfgs, M, N, K, record)
    deep = next(c for c in planner.candidates(spec, current_arch(), M, N, 1152) if c.rs and c.BK == 128)
    with pytest.raises(ValueError, match=f"config {deep.name} does not run at N={N}, K={K}"):
        Kernel(spec, deep).grid(M, N, K)


PAIR_TABLE_SPECS = [n for n in RS_SPECS
                    if any(c.pair_table for c in planner.candidates(_run_spec(n), "sm_90", 70, 1024, 1024))]


@pytest.mark.gpu
@pytest.mark.parametrize("name", PAIR_TABLE_SPECS)
@pytest.mark.parametrize("M,N,K", [(13, 264, 1152), (300, 1032, 2176)])
def test_pair_tables_equal_the_code_by_code_kernel(name, M, N, K, record):
    """The rs GEMM's pair tables (Config.pair_table: each byte's two values
    looked up at once) hold the values the code-by-code decoding computes,
    in the same fp16 rounding, so each config's output equals its
    code-by-code twin's bit for bit (where the twin has that tile), and the
    reference within its tolerance. hw.Calibration.rs_pair_tables waits for
    this and a timing."""
    skip_without("wgmma")
    spec = _run_spec(name)
    cands = planner.candidates(spec, current_arch(), M, N, K)
    cfgs = [c for c in cands if c.pair_table]
    assert cfgs
    pairs = [(c, replace(c, pair_table=False)) for c in cfgs]
    pairs = [(c, t if t in cands else None) for c, t in pairs]
    assert sum(t is not None for _, t in pairs) >= len(pairs) // 2
    check_twins(spec, pairs, M, N, K, record)


A8_GEMV_SPECS = [n for n in MATMUL_SPECS if _run_spec(n).a.dtype in A8_DTYPES and any(
    c.family == "gemv" for c in planner.candidates(_run_spec(n), "sm_90", 1, 1024, 1024))]


@pytest.mark.gpu
@pytest.mark.parametrize("name", A8_GEMV_SPECS)
@pytest.mark.parametrize("M,N,K", [(1, 264, 1152), (3, 1032, 2176), (7, 264, 2176), (13, 264, 1152),
                                   (16, 520, 1152)])
def test_a8_gemvs_match_reference(name, M, N, K, record):
    """The GEMVs of 8-bit activations, every config at tails, in the layout
    opgen.load runs: the int8 GEMV (int8 activations and integer codes:
    planner.gemv.int_dot; an int32 output bit for bit; mmax 8 unsplit at
    M = 7) and the others, which stage the activations as fp16 values, code
    x a_scale[m] (hw.Calibration.int8_gemv_max_m and a8_gemv_max_m rest on
    them)."""
    spec = _run_spec(name)
    cfgs = [c for c in planner.candidates(spec, current_arch(), M, N, K) if c.family == "gemv"]
    if not cfgs:
        assert spec.out.dtype == "int32" and M > 8, (name, M)
        pytest.skip("an int32 output runs only on the int8 GEMV (M <= 8)")
    check_all(spec, cfgs, M, N, K, record)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["w4a8_int8", "bitnet_b158_a8"])
@pytest.mark.parametrize("M,N,K", [(300, 264, 1152), (1000, 1032, 2176)])
def test_a8_predecode_matches_reference(name, M, N, K, record):
    """Sub-byte codes widened once into 8-bit ones for the dense 8-bit GEMMs
    ("predecode" in hw.Calibration.a8_verified waits for this): every
    predecode config at tails, in the layout opgen.load runs."""
    skip_without("wgmma")          # (8-bit activations predecode into the wgmma GEMMs)
    spec = _run_spec(name)
    cfgs = [c for c in planner.candidates(spec, current_arch(), M, N, K) if c.predecode]
    assert cfgs
    check_all(spec, cfgs, M, N, K, record)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gptq_v2_w4a16_g128", "gptq_v2_w4a16_g128@exec", "awq_w4a16_g128@exec",
                                  "w4a16_sym_g128", "bnb_nf4", "mxfp4", "bitnet_b158", "fp8_e4m3_w8a16",
                                  "w1a16_g128", "w8a8_int8", "w2a16_g128@exec", "bitnet_b158@exec",
                                  "w1a16_g128@exec"])
@pytest.mark.parametrize("M", [1, 5, 70])
def test_every_candidate(name, M, record):
    """Every configuration the tuner may time, at a small odd shape: a config
    that faults would otherwise take a whole tuning run down (in the stored
    form and in the execution layouts opgen.load runs; the rs GEMM's
    decodings not yet run on the device among them)."""
    spec = run_spec(name)
    N, K = 264, 1024
    check_all(spec, planner.candidates(spec, current_arch(), M, N, K), M, N, K, record)


def _gemv_specs(row_axis):
    """Specs with fp16/bf16 activations whose weights are stored [N, K]
    (row_axis "n": the row GEMV, activations staged in shared memory) or
    [K, N] ("k", GPTQ and AWQ: the column GEMV)."""
    out = []
    for name in MATMUL_SPECS:
        spec = load_spec(shipped_specs()[name])
        if spec.a.dtype in ("float16", "bfloat16") and weight_layout(spec).row_axis == row_axis:
            out.append(name)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("name", _gemv_specs("n"))
@pytest.mark.parametrize("M", [1, 3, 7, 12])
def test_every_row_gemv(name, M, record):
    """Every row-GEMV config (columns per warp, vector width, split-K, rows
    of activations staged; the tensor-core one for up to 16 rows, M = 12: two
    m-tiles, the second part-filled) at N = 264 (the last block's column sets
    run past N) and K = 1152 (runs of vectors end part-way)."""
    spec = load_spec(shipped_specs()[name])
    N, K = 264, 1152
    cfgs = [c for c in planner.candidates(spec, current_arch(), M, N, K) if c.family == "gemv"]
    assert cfgs
    check_all(spec, cfgs, M, N, K, record)


@pytest.mark.gpu
@pytest.mark.parametrize("name", _gemv_specs("k"))
@pytest.mark.parametrize("M", [1, 3, 7])
def test_every_column_gemv(name, M, record):
    """Every column-GEMV config (vector width, split-K, rows of activations)
    at N = 288 and K = 1152: the warps' runs end part-way through the slice."""
    spec = load_spec(shipped_specs()[name])
    N, K = 288, 1152
    cfgs = [c for c in planner.candidates(spec, current_arch(), M, N, K) if c.family == "gemv"]
    assert cfgs
    check_all(spec, cfgs, M, N, K, record)


PREDECODE_SPECS = [n for n in MATMUL_SPECS
                   if any(c.predecode for c in planner.candidates(load_spec(shipped_specs()[n]),
                                                                  "sm_90", 1024, 4096, 4096))]


@pytest.mark.gpu
@pytest.mark.parametrize("name", PREDECODE_SPECS)
@pytest.mark.parametrize("M,N,K", [(260, 288, 1152), (1024, 4096, 4096)])
def test_predecode_matches_reference(name, M, N, K, record):
    """Every predecode config (dequant stage into the scratch tensor, then the
    dense GEMM) at N past the tile (288; a multiple of 32 for AWQ's 16-byte
    rows) and at the size it is picked for."""
    spec = load_spec(shipped_specs()[name])
    if spec.a.dtype in A8_DTYPES:
        skip_without("wgmma")      # (8-bit activations predecode into the wgmma GEMMs)
    cfgs = [c for c in planner.candidates(spec, current_arch(), M, N, K) if c.predecode]
    assert cfgs
    if K == 4096:    # the large shape: one tile per kind (mma.sync / wgmma, width)
        one = {}
        for c in cfgs:
            one.setdefault((c.wgmma, c.BN, c.WN), c)
        cfgs = list(one.values())
    check_all(spec, cfgs, M, N, K, record)


@pytest.mark.gpu
@pytest.mark.parametrize("name", RUN_SPECS)
def test_memcheck_one_config_of_each_kind(name, record):
    """One config of each kernel kind a spec has (GEMV, tensor-core GEMV,
    mma.sync and TMA GEMMs, rs GEMM, predecode), at tails in M, N and K;
    `bash bench/gpu_run.sh memcheck` runs this under compute-sanitizer
    (memcheck: every load and store in bounds)."""
    spec = run_spec(name)
    arch = current_arch()
    checked = 0
    for M in (13, 70, 300):
        for N in (264, 288):                       # (288: rows of 16 bytes for [K, N] words)
            K = 1152
            try:
                cands = planner.candidates(spec, arch, M, N, K)
            except planner.PlanError:
                continue
            kinds = {}
            for c in cands:
                kind = "predecode" if c.predecode else planner.plan(spec, c, arch).kind
                kinds.setdefault((kind, c.split_k > 1), c)
            check_all(spec, list(kinds.values()), M, N, K, record)
            checked += len(kinds)
            break
    assert checked, f"{name}: no shape ran"


@pytest.mark.gpu
def test_pdl_chained_and_in_a_graph(record):
    """Programmatic dependent launch (Kernel pdl=True): one config of each
    kind and split-K the spec has at M = 13, chained on one stream (each
    reads the previous one's output, which it may start before; the first
    behind a CuPy kernel, not opgen's), run directly and replayed from a
    captured CUDA graph: every output matches the reference computed from
    the input it read. (Scales rescaled so that a layer keeps its input's
    size, N = K, and the chain stays in fp16 range.)"""
    arch = current_arch()
    if hw.arch(arch).cc < 90:
        pytest.skip(f"PDL needs sm_90, not {arch}")
    spec = _run_spec("w4a16_sym_g128")
    M, N = 13, 1024
    cfgs = {}
    for c in planner.candidates(spec, arch, M, N, N):
        cfgs.setdefault((planner.plan(spec, c, arch).kind, c.split_k > 1), c)
    tensors, w_real = weights(spec, N, N)
    gain = 1 / float(np.sqrt((w_real ** 2).sum(axis=1).mean()))
    tensors = dict(tensors, scales=(tensors["scales"].astype(np.float32) * gain).astype(tensors["scales"].dtype))
    w_real = dequantize(spec, tensors, N, N)
    sess = session()
    xp, dev_w = sess.xp, {k: sess.to_device(v) for k, v in tensors.items()}
    a, _ = random_activation(spec, M, N, np.random.default_rng(0))
    src = sess.to_device(a)
    # NaN first, as before the graph's replay: an output left unwritten fails
    bufs = [xp.full((M, N), np.nan, dtype=src.dtype) for _ in range(len(cfgs) + 1)]
    kernels = [Kernel(spec, c, arch, pdl=True) for c in cfgs.values()]

    def chain():
        xp.multiply(src, 1, out=bufs[0])
        for i, k in enumerate(kernels):
            k(bufs[i], dev_w, bufs[i + 1], stream=sess.stream)

    def check(how):
        got = [sess.to_host(b) for b in bufs]
        for i, cfg in enumerate(cfgs.values()):
            ref = reference_matmul_f32(spec, got[i], tensors, w_real=w_real)
            out = got[i + 1].astype(np.float64)
            err = output_error(spec, out, ref)
            finite = bool(np.isfinite(out).all())
            record(spec=spec.name, config=cfg.name, M=M, N=N, K=N, rel_err=err, finite=finite,
                   tol=tolerance(spec), ok=finite and err <= tolerance(spec), pdl=how)
            assert finite, f"{cfg.name} ({how}): unwritten or non-finite outputs"
            assert err <= tolerance(spec), f"{cfg.name} ({how}): rel err {err:.2e}"

    with sess.stream:
        chain()                                  # loads the kernels, makes split-K workspaces
    sess.synchronize()
    check("stream")
    graph = sess.capture(chain)
    with sess.stream:
        for b in bufs:
            b.fill(np.nan)
        graph.launch(sess.stream)
    sess.synchronize()
    check("graph")

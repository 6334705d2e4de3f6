"""planner/gemm.py: the cp.async GEMM (mma.sync or wgmma) and the refusals
that name their reason."""
import dataclasses

import pytest

from opgen.codegen import hw, planner
from opgen.codegen.lower import numerics
from opgen.codegen.resolve import load_spec, shipped_specs

MATMUL = [n for n, p in sorted(shipped_specs().items()) if load_spec(p).op == "matmul"]


def spec(name):
    return load_spec(shipped_specs()[name])


@pytest.mark.parametrize("name", MATMUL)
def test_wgmma_only_where_it_runs(name):
    """wgmma configs on sm_90 for K-major weights (all but AWQ), never on sm_80,
    and 128-byte operand rows (the rs GEMM: k-tiles of one or two)."""
    s = spec(name)
    # (predecode configs read the dense [N, K] twin: K-major for every spec)
    wg = [c for c in planner.candidates(s, "sm_90", 256, 4096, 4096) if c.wgmma and not c.predecode]
    assert bool(wg) == (name != "awq_w4a16_g128")
    for c in wg:
        g = planner.geometry(s, c, "sm_90")
        assert g["target"] == "sm_90a" and c.WM == 64 and c.BK * g["ce"] in ((128, 256) if c.rs else (128,))
    assert not any(c.wgmma for c in planner.candidates(s, "sm_80", 256, 4096, 4096))


def test_wgmma_refusals_name_the_reason():
    with pytest.raises(planner.PlanError, match="sm_90a"):
        planner.geometry(spec("w4a16_sym_g128"), planner.Config("gemm", 64, 128, 64, 64, 128, 4, 1, wgmma=True), "sm_80")
    with pytest.raises(planner.PlanError, match="K-major"):
        planner.geometry(spec("awq_w4a16_g128"), planner.Config("gemm", 64, 128, 64, 64, 128, 4, 1, wgmma=True), "sm_90")
    with pytest.raises(planner.PlanError, match="128-byte rows"):
        planner.geometry(spec("w8a8_int8"), planner.Config("gemm", 64, 128, 256, 64, 128, 4, 1, wgmma=True), "sm_90")


def test_geometry_refusals_name_the_reason():
    s = spec("w8a8_int8")
    with pytest.raises(planner.PlanError, match="multiple of 128"):
        planner.geometry(s, planner.Config("gemm", 16, 128, 64, 16, 32, 4, 1), "sm_90")
    # the GEMVs take e4m3 activations only with a row scale (staged as fp16 values)
    e4m3 = spec("fp8_e4m3_w8a8")
    unscaled = dataclasses.replace(e4m3, a=dataclasses.replace(e4m3.a, scale=None))
    with pytest.raises(planner.PlanError, match="float16/bfloat16 activations, or 8-bit ones"):
        planner.geometry(unscaled, planner.Config("gemv"), "sm_90")
    # no e4m3 mma before sm_89: fp8 activations are widened to fp16 (BK of 64 halves)
    g = planner.geometry(spec("fp8_e4m3_w8a8"), planner.Config("gemm", 16, 128, 64, 16, 32, 4, 1), "sm_80")
    assert g["a_decode"] and not g["dense"]
    # ... but not on the GEMVs, which stage them as fp16 values on every arch
    assert planner.geometry(spec("fp8_e4m3_w8a8"), planner.Config("gemv"), "sm_80")["scheme"] == "row"
    with pytest.raises(planner.PlanError, match="shared memory"):
        planner.geometry(spec("fp16"), planner.Config("gemm", 128, 128, 64, 64, 32, 16, 1), "sm_86")


@pytest.mark.parametrize("name", MATMUL)
def test_inexact_wgmma_sums_each_k_tile_apart(name):
    """Where wgmma keeps no full fp32 sum (hw.Wgmma.exact_acc: fp8), every
    wgmma config of both GEMMs adds each k-tile's sums up in fp32 (promote:
    nothing kept in flight across tiles), and no config holds more than the
    two sets of accumulators fit (WN <= 128); elsewhere none does."""
    s = planner.execution_spec(spec(name), "sm_90")
    inexact = not hw.WGMMAS[numerics(s).mma].exact_acc
    wg = [c for c in planner.candidates(s, "sm_90", 256, 4096, 57344) if c.wgmma and not c.rs]
    for c in wg:
        g = planner.geometry(s, c, "sm_90")
        assert g["promote"] == inexact, c.name
        if inexact:
            assert c.WN <= 128 and (c.tma or not g["inflight"]), c.name
    if inexact:
        assert wg, "fp8 keeps its wgmma configs"
        wide = [planner.Config("gemm", 64, 256, 128, 64, 256, 4, 1, wgmma=True)]
        if numerics(s).dense:
            wide.append(planner.Config("gemm", 128, 256, 128, 64, 256, 4, 1, wgmma=True, tma=True))
        for c in wide:
            with pytest.raises(planner.PlanError, match="accumulator"):
                planner.geometry(s, c, "sm_90")

"""planner/dequant.py: the dequant stage of predecode configs and the dense
twin its GEMM multiplies."""
import dataclasses

import pytest

from opgen.codegen import hw, planner
from opgen.codegen.lower import numerics
from opgen.codegen.resolve import load_spec, shipped_specs

MATMUL = [n for n, p in sorted(shipped_specs().items()) if load_spec(p).op == "matmul"]


def spec(name):
    return load_spec(shipped_specs()[name])


@pytest.mark.parametrize("name", MATMUL)
def test_predecode_stages(name):
    """Decoded weights at large M: the dequant stage of the spec, then the dense
    GEMM of its twin (activation-dtype weights [N, K], no scales); offered from
    M = 256, picked by the heuristic from `predecode_from`; never for dense weights.
    (Sub-byte codes widened for 8-bit activations: test_8_bit_codes below.)"""
    s = spec(name)
    decoded = not numerics(s).dense and s.a.dtype in ("float16", "bfloat16")
    assert not any(c.predecode for c in planner.candidates(s, "sm_90", 255, 4096, 4096))
    pd = [c for c in planner.candidates(s, "sm_90", 256, 4096, 4096) if c.predecode]
    # (test_8_bit_codes below; an int32 output is the cp.async GEMM's alone)
    widened = numerics(s).widen and numerics(s).scale_gran != "group" and s.out.dtype != "int32"
    assert bool(pd) == (decoded or widened)
    pick = planner.heuristic(s, "sm_90", 16384, 4096, 4096)
    assert pick.predecode == (decoded or widened)
    if not decoded:
        return
    (q, dq), (twin, gemm) = planner.stages(s, pick)
    assert q == s and dq == planner.DEQUANT and pick.name.endswith("_pd")
    assert twin.b.dtype == s.a.dtype and twin.b.layout == "nt" and twin.b.scale is None
    assert gemm == dataclasses.replace(pick, predecode=False) and gemm.wgmma
    assert planner.geometry(s, pick, "sm_90")["predecode"]
    assert planner.geometry(s, dq, "sm_90")["b_kmajor"]      # [N, K] rows out
    assert planner.grid(s, dq, 4096, 8192) == (8192 // dq.BN, planner.DEQUANT_KSPLIT, 1)
    start = planner.predecode_from(s, planner.candidates(s, "sm_90", 1024, 4096, 4096), "sm_90")
    assert planner.heuristic(s, "sm_90", start, 4096, 4096).predecode
    assert not planner.heuristic(s, "sm_90", start - 1, 4096, 4096).predecode


def test_8_bit_codes_predecoded_for_8_bit_activations(monkeypatch):
    """Sub-byte codes with 8-bit activations and a channel or tensor scale:
    the dequant stage (128-deep tiles: 128-byte rows of codes) writes their
    q - z as 8-bit codes, and the dense twin (8-bit weights keeping the scale)
    runs on the 8-bit GEMMs (TMA too); group scales are refused (they apply
    to partial sums). The heuristic picks them from
    planner.predecode_from (past their rs GEMM's measured M), and only for the activation
    dtypes checked on the device ("predecode/int8" in
    hw.Calibration.a8_verified: e4m3 activations widened alike are not)."""
    for name, gran in (("w4a8_int8", "channel"), ("bitnet_b158_a8", "tensor")):
        s = planner.execution_spec(spec(name), "sm_90")
        pd = [c for c in planner.candidates(s, "sm_90", 4096, 8192, 8192) if c.predecode]
        assert pd and any(c.tma for c in pd) and all(c.BK == 128 for c in pd)
        (q, dq), (twin, gemm) = planner.stages(s, pd[0])
        assert dq == planner.DEQUANT_8BIT == planner.dequant_config(s)
        assert planner.geometry(s, dq, "sm_90")["ce"] == 1
        assert twin.b.dtype == "int8" and twin.b.scale == s.b.scale and twin.b.scale.granularity == gran
        assert twin.b.zero.kind == "none" and numerics(twin).dense and twin.name.endswith(gran)
        start = planner.predecode_from(s, planner.candidates(s, "sm_90", 4096, 8192, 8192), "sm_90")
        assert planner.heuristic(s, "sm_90", start, 8192, 8192).predecode
        assert not planner.heuristic(s, "sm_90", start - 1, 8192, 8192).predecode
        unverified = dataclasses.replace(hw.H200, a8_verified=frozenset())
        monkeypatch.setitem(hw.CALIBRATION, "H200", unverified)
        assert not planner.heuristic(s, "sm_90", start, 8192, 8192).predecode
        monkeypatch.undo()
    # e4m3 activations with a channel scale: predecode candidates, never picked
    fp8 = spec("w4a8_fp8")
    fp8 = dataclasses.replace(fp8, b=dataclasses.replace(fp8.b, scale=spec("w4a8_int8").b.scale))
    fp8 = planner.execution_spec(fp8, "sm_90")
    assert any(c.predecode for c in planner.candidates(fp8, "sm_90", 4096, 8192, 8192))
    start = planner.predecode_from(fp8, planner.candidates(fp8, "sm_90", 4096, 8192, 8192), "sm_90")
    assert not planner.heuristic(fp8, "sm_90", start, 8192, 8192).predecode
    g128 = planner.execution_spec(spec("w4a8_int8_g128"), "sm_90")
    with pytest.raises(planner.PlanError, match="channel or tensor scales"):
        planner.geometry(g128, planner.DEQUANT_8BIT, "sm_90")

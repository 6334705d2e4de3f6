"""planner/dequant.py: the dequant stage of predecode configs and the dense
twin its GEMM multiplies."""
import dataclasses

import pytest

from opgen.codegen import planner
from opgen.codegen.lower import numerics
from opgen.codegen.resolve import load_spec, shipped_specs

MATMUL = [n for n, p in sorted(shipped_specs().items()) if load_spec(p).op == "matmul"]


def spec(name):
    return load_spec(shipped_specs()[name])


@pytest.mark.parametrize("name", MATMUL)
def test_predecode_stages(name):
    """Decoded weights at large M: the dequant stage of the spec, then the dense
    GEMM of its twin (activation-dtype weights [N, K], no scales); offered from
    M = 256, picked by the heuristic from `predecode_from`; never for dense weights."""
    s = spec(name)
    decoded = not numerics(s).dense and s.a.dtype in ("float16", "bfloat16")
    assert not any(c.predecode for c in planner.candidates(s, "sm_90", 255, 4096, 4096))
    pd = [c for c in planner.candidates(s, "sm_90", 256, 4096, 4096) if c.predecode]
    assert bool(pd) == decoded
    pick = planner.heuristic(s, "sm_90", 4096, 4096, 4096)
    assert pick.predecode == decoded
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

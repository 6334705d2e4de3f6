"""planner/space.py: the candidates worth timing for a problem."""
import pytest

from opgen.codegen import planner
from opgen.codegen.resolve import load_spec, shipped_specs

MATMUL = [n for n, p in sorted(shipped_specs().items()) if load_spec(p).op == "matmul"]


def spec(name):
    return load_spec(shipped_specs()[name])


@pytest.mark.parametrize("name", MATMUL)
@pytest.mark.parametrize("M", [1, 3, 8, 16, 100, 4096])
def test_candidates_and_heuristic(name, M):
    s = spec(name)
    cands = planner.candidates(s, "sm_90", M, 4096, 11008)
    assert cands and len(set(cands)) == len(cands)
    pick = planner.heuristic(s, "sm_90", M, 4096, 11008)
    assert pick in cands
    for c in cands:
        assert c.family == "gemm" or M <= c.mmax <= (16 if c.tc else 8)
        if c.family == "gemm":
            # wgmma tiles are 64 rows at least and tried from M = 9 on
            assert c.BM <= max(64 if c.wgmma else 16, 2 * M)
            assert not c.wgmma or M > 8
    if M > 16:
        assert pick.family == "gemm"
    elif M > 8:
        assert pick.family == "gemm" or pick.tc

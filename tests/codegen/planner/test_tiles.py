"""planner/tiles.py: the decoded weight tile, built of weight vectors
(codegen/lower.py: tests/codegen/test_lower.py)."""
import pytest

from opgen.codegen.lower import numerics, weight_layout
from opgen.codegen.planner import tiles
from opgen.codegen.resolve import load_spec, shipped_specs

MATMUL = [n for n, p in sorted(shipped_specs().items()) if load_spec(p).op == "matmul"]


def spec(name):
    return load_spec(shipped_specs()[name])


@pytest.mark.parametrize("name", MATMUL)
def test_decoded_tile_stores_each_element_once(name):
    """The shared-memory stores of a decoded tile write every element of a
    weight vector once (K-major for the wgmma and TMA GEMMs, the stored
    orientation otherwise)."""
    s = spec(name)
    num, lay = numerics(s), weight_layout(s)
    if num.dense or s.a.dtype not in ("float16", "bfloat16"):
        pytest.skip("no decoded tile")
    t = tiles.decoded_tile(lay, num, 128, 64, tiles.k_major(lay))
    elems = sorted(e for st in t["stores"] for e in st["elems"])
    assert elems == list(range(t["vec"].nrows * t["vec"].ncols))
    assert all(st["count"] in (1, 2, 4, 8) and st["inner"] % st["count"] == 0 for st in t["stores"])

"""planner/tiles.py and the lowering it stands on: weight vectors (the
units decoded tiles are built of)."""
import pytest

from opgen.codegen.lower import numerics, vector, weight_layout
from opgen.codegen.planner import tiles
from opgen.codegen.resolve import load_spec, shipped_specs

MATMUL = [n for n, p in sorted(shipped_specs().items()) if load_spec(p).op == "matmul"]


def spec(name):
    return load_spec(shipped_specs()[name])


@pytest.mark.parametrize("name", MATMUL)
def test_vector_covers_each_element_once(name):
    """Every code slot of a weight vector lands on a distinct element, and the
    elements fill the vector's logical extent."""
    s = spec(name)
    lay = weight_layout(s)
    for vb in (4, 8, 16):
        if vb % lay.elem_bytes:
            continue
        for byte_pairs in ((False, True) if lay.bits == 4 else (False,)):
            v = vector(lay, vb, byte_pairs)
            seen = sorted([p.ia for p in v.pairs] + [p.ib for p in v.pairs])
            assert seen == list(range(v.nrows * v.ncols))
            cells = set(zip(v.dn, v.dk))
            assert len(cells) == v.nrows * v.ncols == v.n_extent * v.k_extent


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

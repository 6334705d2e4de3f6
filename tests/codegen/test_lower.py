"""Lowering (codegen/lower.py): the stored weight's layout as the kernels
address it, the numerics of each spec, and weight vectors (the units decoded
tiles are built of)."""
import pytest

from opgen.codegen.lower import decode_plan, numerics, rs_byte_pairs, rs_pairs, vector, weight_layout
from opgen.codegen.resolve import load_spec, shipped_specs
from opgen.codegen.spec import weight_storage_shape

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
def test_layout_storage_is_the_stored_array(name):
    """The layout's (rows, bytes per row) is the stored weight array the
    reference draws (spec.weight_storage_shape), words of elem_bytes."""
    s = spec(name)
    lay = weight_layout(s)
    N, K = 4096, 2048
    rows, cols = weight_storage_shape(s.b, N, K)
    assert lay.storage(N, K) == (rows, cols * lay.elem_bytes)
    assert sorted(lay.order) == list(range(len(lay.order)))


@pytest.mark.parametrize("name", MATMUL)
def test_numerics_dense_and_fp8_fallback(name):
    """Weights already in the mma type need no decode; without an e4m3 mma
    (sm_80/86) fp8 activations are widened and run on the f16 tensor cores."""
    s = spec(name)
    num = numerics(s)
    assert num.mma == s.a.dtype and not num.a_decode
    assert num.dense == (s.b.dtype == s.a.dtype)
    old = numerics(s, fp8_mma=False)
    if s.a.dtype == "float8_e4m3":
        assert old.mma == "float16" and old.a_decode and not old.dense
    else:
        assert old == num


def test_rs_byte_pairs():
    """A lane's pair is one byte's two nibbles in NF4 (the first code, even
    k, in the high nibble: bitsandbytes' order) and MXFP4 (low nibble
    first); not in the interleaved 4-bit words (a word's two halves), nor
    for 2-bit or 8-bit codes. The pair table's entry order follows."""
    want = {"bnb_nf4": True, "mxfp4": False, "w4a16_sym_g128": None, "w2a16_g128": None,
            "bitnet_b158": None, "fp8_e4m3_w8a16": None}
    for name, high_first in want.items():
        lay = weight_layout(spec(name))
        assert rs_byte_pairs(rs_pairs(lay, 128)) is high_first, name
    lay, num = weight_layout(spec("bnb_nf4")), numerics(spec("bnb_nf4"))
    assert decode_plan(lay, num, pair_table=True, high_first=True).high_first
    assert not decode_plan(lay, num, pair_table=True).high_first

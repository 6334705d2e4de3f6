"""The tiled test problem and its check (runtime/tiled.py), numpy only: the
shortcut reference of the tiled problem equals the full reference, base
shapes and rows, the shared random data, and the outputs' storage."""
import numpy as np
import pytest

from opgen.bench.plan import shipped_matmul_specs
from opgen.codegen.random_data import random_activation, random_weight_tensors
from opgen.codegen.reference import dequantize, reference_matmul_f32
from opgen.codegen.spec import Activation, Output, Spec, stored_shapes
from opgen.codegen.resolve import as_spec
from opgen.runtime import tiled


@pytest.mark.parametrize("name", shipped_matmul_specs())
def test_tiled_problem_check(name):
    """The GPU side draws reference weights at N0 x K0 and tiles them; the
    shortcut reference of check_rows must equal the full reference of the
    tiled problem, and flag a wrong output."""
    s = as_spec(name)
    N, K, M = 512, 1024, 5
    N0, K0 = tiled.base_shape(s, N, K, 256)
    assert (N0, K0) == (256, 256)
    rng = np.random.default_rng(3)
    w = random_weight_tensors(s, N0, K0, rng)
    want = stored_shapes(s, N, K)
    big = {k: tiled.tile_to(v, want[k]) for k, v in w.items()}
    a0, s0 = random_activation(s, M, K0, rng)
    full = reference_matmul_f32(s, tiled.tile_to(a0, (M, K)), big, a_scale=s0)
    rows = tiled.check_rows_of(M)
    assert list(rows) == [0, 1, 2, 3, 4]
    w_ref = dequantize(s, w, N0, K0).astype(np.float64)
    s_rows = None if s0 is None else s0[rows]
    ok = tiled.check_rows(s, a0[rows], s_rows, w_ref, None, full[rows], N, K, N0, K0)
    assert ok["verified"] is True and ok["rel_err"] < 1e-6
    bad = full[rows].copy()
    bad[:, N0:] = 0                                   # second N tile unwritten
    assert tiled.check_rows(s, a0[rows], s_rows, w_ref, None, bad, N, K, N0, K0)["verified"] is False
    nan = full[rows].copy()
    nan[0, 0] = np.nan
    assert tiled.check_rows(s, a0[rows], s_rows, w_ref, None, nan, N, K, N0, K0)["verified"] is False


def test_tiled_rows():
    """Activations are drawn at M0 rows and tiled along M as well."""
    assert tiled.base_rows(1) == 1 and tiled.base_rows(256) == 256 and tiled.base_rows(512) == 512
    assert tiled.base_rows(4096) == 512 and tiled.base_rows(1000) == 1000
    assert list(tiled.check_rows_of(4096)) == [0, 1, 2, 3, 2048, 4095]
    assert list(tiled.check_rows_of(1)) == [0]


def test_base_shape():
    s = as_spec("gptq_v2_w4a16_g128")
    assert tiled.base_shape(s, 14336, 57344, limit=4096) == (2048, 4096)
    assert tiled.base_shape(s, 8192, 8192, limit=4096) == (4096, 4096)
    assert tiled.base_shape(s, 8192, 8192) == (2048, 2048)
    assert tiled.base_shape(s, 28672, 8192) == (2048, 2048)
    # a base that breaks the spec's alignment (K0 = 64 < group 128): the full shape
    assert tiled.base_shape(s, 4096, 4096 + 64, limit=4096) == (4096, 4096 + 64)
    with pytest.raises(ValueError):
        tiled.tile_to(np.zeros((3, 4)), (4, 4))


def test_base_data_are_shared_and_reproducible():
    spec = as_spec("gptq_v2_w4a16_g128")
    w = tiled.base_weights(spec, 256, 256, 0)
    assert tiled.base_weights(spec, 256, 256, 0) is w          # every shape of the spec
    assert w.real.shape == (256, 256) and np.any(w.real != 0)
    act = tiled.base_activation(spec, 16, 256, 0)
    assert act.a.shape == (16, 256) and act.a_scale is None and act.input is act.a
    assert not np.array_equal(act.a, tiled.base_activation(spec, 16, 256, 1).a)


def test_nonfinite_counts_poison_in_every_out_dtype():
    for dtype, arr in (("float16", np.zeros(8, np.float16)), ("float32", np.zeros(8, np.float32)),
                       ("bfloat16", np.zeros(8, np.uint16))):
        spec = Spec(name="x", op="matmul", a=Activation("float16"), b=None, out=Output(dtype))
        arr[:3] = tiled.poison(spec)
        assert tiled.nonfinite(spec, arr, np) == 3
        assert np.isnan(tiled.out_to_f32(spec, arr[:3])).all()
        assert arr.dtype == tiled.out_dtype(spec)


def test_int32_outputs_convert_exactly_past_2_to_the_24():
    spec = Spec(name="x", op="matmul", a=Activation("int8"), b=None, out=Output("int32"))
    big = np.array([2 ** 24 + 1, -(2 ** 30) - 3, tiled.INT32_POISON], dtype=np.int32)
    got = tiled.out_to_f32(spec, big)
    assert got[0] == 2 ** 24 + 1 and got[1] == -(2 ** 30) - 3 and np.isnan(got[2])

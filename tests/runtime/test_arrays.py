"""Argument checking of the array interop (CPU: a stand-in array object)."""
import pytest

from opgen.runtime import arrays


def view(ptr=4096, shape=(4, 64), dtype="float16", contiguous=True, device=0):
    return arrays.View(ptr, shape, dtype, contiguous, device, "cupy", None)


def test_accepts_matching_array_and_aliases():
    arrays.check(view(), "a", (4, 64), "float16", 0)
    arrays.check(view(dtype="uint16"), "a", (4, 64), "bfloat16", 0)       # bf16 as bits
    arrays.check(view(dtype="uint32"), "qweight", (4, 64), "int32", 0)    # int32 container


@pytest.mark.parametrize("kw, match", [
    (dict(shape=(4, 32)), r"a: shape \[4, 32\], expected \[4, 64\]"),
    (dict(dtype="float32"), r"a: dtype float32, expected float16"),
    (dict(contiguous=False), "contiguous"),
    (dict(ptr=4096 + 2), "16-byte aligned"),
    (dict(device=1), "on device 1"),
])
def test_refusals_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        arrays.check(view(**kw), "a", (4, 64), "float16", 0)


def test_rejects_foreign_objects():
    with pytest.raises(ValueError, match="CuPy array or a torch CUDA tensor"):
        arrays.view([1, 2, 3], "a")
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="on cpu"):
        arrays.view(torch.zeros(4), "a")


def test_transcoded_gives_each_result_back_as_its_input_kind():
    """numpy in, numpy out; torch CPU tensors in (bfloat16 as the integer of
    its width: CuPy and numpy have no bfloat16), torch tensors of the input's
    dtype out, same bits."""
    import numpy as np
    seen = {}

    def fn(t):
        seen.update({k: type(v).__module__.split(".")[0] for k, v in t.items()})
        return {k: v.T.copy() for k, v in t.items()}
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = arrays.transcoded(fn, {"qweight": x})
    assert seen == {"qweight": "numpy"} and np.array_equal(out["qweight"], x.T)
    torch = pytest.importorskip("torch")
    s = torch.randn(2, 3).to(torch.bfloat16)
    out = arrays.transcoded(fn, {"qweight": torch.from_numpy(x), "scales": s})
    assert seen == {"qweight": "numpy", "scales": "numpy"}
    assert out["scales"].dtype == torch.bfloat16 and torch.equal(out["scales"], s.T)
    assert out["qweight"].dtype == torch.int32 and torch.equal(out["qweight"], torch.from_numpy(x).T)
    with pytest.raises(ValueError, match="qweight: expected a numpy or CuPy array or a torch tensor"):
        arrays.transcoded(fn, {"qweight": [1, 2]})

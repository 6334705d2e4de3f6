"""Transcode (codegen/transcode.py): a weight's stored tensors moved from one
spec's storage to another's, bit-exact, for every format the language has.

The oracle is the reference: the dequantized weight of the result equals
that of the input bit for bit, and transcoding back gives the input's
bytes. Specs are drawn from every dtype, container, packed axis, field
order, layout, scale layout and zero packing the validator accepts
(weight_strategies), at shapes that are odd multiples of what the packing
allows.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen.reference import dequantize
from opgen.codegen.resolve import as_spec, shipped_specs
from opgen.codegen.random_data import random_weight_tensors
from opgen.codegen.spec import Activation, Output, Pack, Spec, Weight, stored_shapes
from opgen.codegen.transcode import TranscodeError, check_compatible, steps, transcode
from weight_strategies import SETTINGS, min_shape, restored, weights


def _spec(w: Weight, name: str) -> Spec:
    return Spec(name, "matmul", Activation("float16"), w, Output())


def _same_bytes(x, y) -> bool:
    x, y = np.asarray(x), np.asarray(y)
    return x.shape == y.shape and x.dtype == y.dtype and np.array_equal(
        np.ascontiguousarray(x).view(np.uint8), np.ascontiguousarray(y).view(np.uint8))


@st.composite
def pairs(draw):
    w, _, _ = draw(weights())
    v = draw(restored(w))
    n, k = min_shape(w, v)
    odd = st.sampled_from((1, 3, 5))
    return _spec(w, "src"), _spec(v, "dst"), n * draw(odd), k * draw(odd)


def _check_round_trip(src, dst, N, K, seed):
    """src's random tensors moved to dst dequantize to the same weight bit
    for bit, and moved back are src's bytes."""
    t = random_weight_tensors(src, N, K, np.random.default_rng(seed))
    u = transcode(src, dst, t, N, K)
    want = dequantize(src, t, N, K)
    got = dequantize(dst, u, N, K)
    assert _same_bytes(want, got)
    back = transcode(dst, src, u, N, K)
    assert set(back) == set(t)
    for name in t:
        assert _same_bytes(back[name], t[name]), name


@settings(**SETTINGS)
@given(pairs(), st.integers(0, 2**32 - 1))
def test_round_trip_is_bit_exact(pair, seed):
    _check_round_trip(*pair, seed)


def test_round_trip_in_bands():
    """Arrays of 2^20 words or more move in bands of 64 rows (numpy):
    GPTQ's qweight just above, [K/8, N] = [1040, 1032] and back, neither
    a whole number of bands, so each way ends on a partial one."""
    src, dst = as_spec("gptq_v2_w4a16_g128"), as_spec("gptq_v2_w4a16_g128_repacked")
    N, K = 1032, 128 * 65
    assert (K // 8) * N >= 1 << 20 and (K // 8) % 64 and N % 64
    _check_round_trip(src, dst, N, K, 8)


def _last_columns(spec, tensors, N, K, n):
    """The stored tensors of the layer's last n output columns."""
    full, cut = stored_shapes(spec, N, K), stored_shapes(spec, n, K)
    return {k: v[tuple(slice(f - c, None) for f, c in zip(full[k], cut[k]))]
            for k, v in tensors.items()}


def test_gptq_to_its_repacked_spec():
    """The as-stored GPTQ qweight [K/8, N] moves to [N, K/8] with the
    interleaved field order; the scales and zero points stay as they are."""
    src, dst = as_spec("gptq_v2_w4a16_g128"), as_spec("gptq_v2_w4a16_g128_repacked")
    assert steps(src, dst) == {"qweight": "transposed, fields reordered", "scales": "kept",
                               "zeros": "kept"}
    N, K = 24, 256
    t = random_weight_tensors(src, N, K, np.random.default_rng(1))
    u = transcode(src, dst, t, N, K)
    codes = np.zeros((N, K), np.int64)
    q = t["qweight"].view(np.uint32)
    for k in range(K):                                   # GPTQ: field k % 8 of word [k // 8, n]
        codes[:, k] = (q[k // 8, :] >> (4 * (k % 8))) & 0xF
    r = u["qweight"].view(np.uint32)
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    for f, e in enumerate(order):                         # repacked: field f of [n, k // 8] holds k % 8 = order[f]
        assert np.array_equal((r >> (4 * f)) & 0xF, codes[:, e::8])
    assert _same_bytes(u["zeros"], t["zeros"])


def test_awq_packed_along_n_to_packed_along_k():
    src = as_spec("awq_w4a16_g128")
    dst = replace(src, name="dst", b=replace(src.b, layout="nt",
                                             pack=Pack("int32", "k", (0, 2, 4, 6, 1, 3, 5, 7))))
    assert steps(src, dst)["qweight"] == "repacked"
    N, K = 40, 384
    t = random_weight_tensors(src, N, K, np.random.default_rng(2))
    u = transcode(src, dst, t, N, K)
    assert u["qweight"].shape == (N, K // 8) and u["qweight"].dtype == np.int32
    assert _same_bytes(dequantize(src, t, N, K), dequantize(dst, u, N, K))


def test_other_keys_pass_through():
    src, dst = as_spec("gptq_v2_w4a16_g128"), as_spec("gptq_v2_w4a16_g128_repacked")
    t = random_weight_tensors(src, 8, 128, np.random.default_rng(3))
    bias = np.ones(8, np.float16)
    assert transcode(src, dst, dict(t, bias=bias), 8, 128)["bias"] is bias


def test_a_change_of_meaning_is_refused_naming_the_field():
    a = as_spec("gptq_v2_w4a16_g128")
    for b, field in ((as_spec("gptq_v1_w4a16_g128"), "b.zero.offset"),
                     (replace(a, b=replace(a.b, scale=replace(a.b.scale, group=64))), "b.scale.group"),
                     (as_spec("bnb_nf4"), "b.dtype")):
        with pytest.raises(TranscodeError, match=field.replace(".", r"\.")):
            check_compatible(a, b)


def test_tensors_that_are_not_the_source_specs_are_refused():
    src, dst = as_spec("gptq_v2_w4a16_g128"), as_spec("gptq_v2_w4a16_g128_repacked")
    N, K = 24, 128
    t = random_weight_tensors(src, N, K, np.random.default_rng(4))
    with pytest.raises(TranscodeError, match="qweight: shape"):
        transcode(src, dst, dict(t, qweight=t["qweight"].T), N, K)
    with pytest.raises(TranscodeError, match="zeros: missing"):
        transcode(src, dst, {"qweight": t["qweight"], "scales": t["scales"]}, N, K)
    with pytest.raises(TranscodeError, match="scales: float32, expected 2-byte"):
        transcode(src, dst, dict(t, scales=t["scales"].astype(np.float32)), N, K)
    with pytest.raises(TranscodeError, match="numpy or CuPy"):
        transcode(src, dst, dict(t, qweight=np.asarray(t["qweight"]).astype(np.int32).tolist()), N, K)
    for name in ("qweight", "zeros"):               # packed words given as floats of their size
        with pytest.raises(TranscodeError, match=f"{name}: float32, expected an integer array"):
            transcode(src, dst, dict(t, **{name: t[name].astype(np.float32)}), N, K)


@pytest.mark.parametrize("name", [n for n in shipped_specs() if as_spec(n).op == "matmul"])
def test_every_shipped_spec_to_itself_keeps_every_tensor(name):
    spec = as_spec(name)
    t = random_weight_tensors(spec, 64, 256, np.random.default_rng(5))
    u = transcode(spec, spec, t, 64, 256)
    assert all(_same_bytes(u[k], t[k]) for k in t)
    assert set(steps(spec, spec).values()) == {"kept"}


@pytest.mark.parametrize("name", ["gptq_v2_w4a16_g128", "awq_w4a16_g128"])
def test_an_8192_x_28672_layer_in_numpy_under_2_s(name):
    """Load time on the CPU: the largest Llama-3-70B-sized layer's qweight
    (117 MB) moved under 2 s on CI's 2 cores (issue target); its last 64
    output columns as the same layer cut to them moves them (under 2^20
    words: no bands, and every band of the source is in the cut)."""
    src = as_spec(name)
    dst = as_spec("gptq_v2_w4a16_g128_repacked")
    dst = replace(dst, b=replace(dst.b, zero=src.b.zero))
    N, K = 28672, 8192
    rng = np.random.default_rng(6)
    shapes = stored_shapes(src, N, K)
    t = {k: rng.integers(0, 2**32, size=shapes[k], dtype=np.uint32).view(np.int32)
         if k != "scales" else np.ones(shapes[k], np.float16) for k in shapes}
    t0 = time.perf_counter()
    u = transcode(src, dst, t, N, K)
    assert time.perf_counter() - t0 < 2.0
    want = transcode(src, dst, _last_columns(src, t, N, K, 64), 64, K)
    got = _last_columns(dst, u, N, K, 64)
    for k in want:
        assert _same_bytes(got[k], want[k]), k


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gptq_v2_w4a16_g128", "awq_w4a16_g128"])
def test_on_the_gpu_equals_numpy_and_an_8192_x_28672_layer_takes_under_5_ms(name, record):
    """CuPy arrays in: the same bytes as numpy's; a Llama-3-70B-sized layer
    moved in under 5 ms (median of 5, CUDA events; issue target)."""
    import cupy as cp
    src = as_spec(name)
    dst = replace(as_spec("gptq_v2_w4a16_g128_repacked"), b=replace(
        as_spec("gptq_v2_w4a16_g128_repacked").b, zero=src.b.zero))
    N, K = 24 * 3, 128 * 5
    t = random_weight_tensors(src, N, K, np.random.default_rng(7))
    want = transcode(src, dst, t, N, K)
    got = transcode(src, dst, {k: cp.asarray(v) for k, v in t.items()}, N, K)
    for k in want:
        assert _same_bytes(cp.asnumpy(got[k]), want[k]), k
    N, K = 28672, 8192
    shapes = stored_shapes(src, N, K)
    big = {k: cp.random.randint(0, 2**31, size=shapes[k], dtype=cp.int32) if k != "scales"
           else cp.ones(shapes[k], cp.float16) for k in shapes}
    transcode(src, dst, big, N, K)                     # warm: CuPy's kernels compiled
    times = []
    for _ in range(5):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        transcode(src, dst, big, N, K)
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    ms = sorted(times)[2]
    record(test="transcode_gpu", spec=name, N=N, K=K, ms=ms)
    assert ms < 5.0, times

"""The GPU workbench (runtime/workbench.py) on a numpy "device"
(tests/numpy_device.py): the tiled problem on the device, its rotating
copies, verification with poisoned outputs, timing through the session's
timer, and the full-shape check of the GPU tests."""
from functools import partial

import numpy as np
import pytest

from numpy_device import FAKE_US, NumpyKernel, NumpySession
from opgen.codegen.reference import dequantize, quantize_activation, reference_matmul
from opgen.codegen.spec import stored_shapes
from opgen.codegen.storage import encode_codes
from opgen.codegen.tolerance import tolerance
from opgen.codegen.resolve import as_spec
from opgen.runtime import workbench


@pytest.mark.parametrize("name", ["gptq_v2_w4a16_g128", "w8a8_int8", "fp8_e4m3_w8a8"])
def test_problem_tiles_the_data_and_checks_rows(name):
    """The real Problem on numpy: weights drawn at the base shape and tiled to
    the full one (stored layout: packed words, scale groups, zeros), the
    activation drawn at M0 rows and tiled; rotating copies over 2x "L2"; a
    correct kernel passes the row check with the tolerance, and a wrong one
    fails it (or the poison shows what it left unwritten)."""
    spec = as_spec(name)
    N, K, M = 512, 1024, 1024
    session = NumpySession(fault=None)
    problem = session.problem(spec, N, K, seed=3)
    assert (problem.N0, problem.K0) == (256, 256)
    want = stored_shapes(spec, N, K)
    assert {k: v.shape for k, v in problem.w_sets[0].items()} == want
    # Random and never zero: the tiled weights repeat the base ones.
    assert np.any(problem.base.real != 0)
    problem.select(M)
    a, a_scale = problem.acts[0]
    assert problem.M0 == 512 and a.shape == (M, K)
    assert np.array_equal(a[:512, :256], a[512:, 256:512]) and np.any(a != 0)
    assert (a_scale is None) == (spec.a.scale != "row")
    # Rotating copies: all sets together over twice the "L2".
    n = len(problem.acts)
    per = (sum(w.nbytes for w in problem.w_sets[0].values()) + a.nbytes
           + (0 if a_scale is None else a_scale.nbytes) + problem.outs[0].nbytes)
    assert n == len(problem.outs) >= 2 and n * per >= 2 * session.l2 and len(problem.w_sets) >= n

    tol = tolerance(spec)
    ok, err, why = problem.verify(session.kernel(spec, "good"), tol)
    assert ok and err < tol / 4, (err, why)
    for fault, msg in (("scale", "error"), ("half_k", "error"),
                       ("last_tile", "outputs NaN/Inf")):
        # The check buffer first holds a correct result, so rows left unwritten
        # show only if verify poisons it before the launch.
        assert problem.verify(session.kernel(spec, "good"), tol)[0]
        session.fault = fault
        ok, err, why = problem.verify(session.kernel(spec, "faulty"), tol)
        assert not ok and msg in why, (fault, err, why)
    session.fault = None
    # Another M reuses the weight copies; close frees everything.
    n_w = len(problem.w_sets)
    problem.select(16)
    assert problem.acts[0][0].shape == (16, K) and len(problem.w_sets) >= n_w
    assert problem.verify(session.kernel(spec, "good"), tol)[0]
    problem.close()
    assert problem.w_sets is None and session.released == 1


def test_a_float_input_is_checked_against_its_codes():
    """select(M, input_dtype="float16"): the kernel is given float16 rows (as
    the fused linear is) and checked against the codes they quantize to."""
    spec = as_spec("w8a8_int8")
    session = NumpySession()
    problem = session.problem(spec, 256, 512)
    problem.select(6, input_dtype="float16")
    x, x_scale = problem.acts[0]
    assert x.dtype == np.float16 and x.shape == (6, 512) and x_scale is None

    def linear(x, w, out, a_scale=None, bias=None, stream=None):
        codes, scale = quantize_activation(spec, x)
        NumpyKernel(spec)(codes, w, out, a_scale=scale, bias=bias)
    ok, err, why = problem.verify(linear, tolerance(spec))
    assert ok, why


def test_a_kernel_that_raises_fails_verification():
    spec = as_spec("w4a16_sym_g128")
    problem = NumpySession().problem(spec, 256, 256)
    problem.select(4)

    def broken(*a, **k):
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")
    ok, err, why = problem.verify(broken, 1e-3)
    assert not ok and err == float("inf") and why.startswith("launch failed: RuntimeError")


def test_timing_goes_through_the_session_timer():
    spec = as_spec("w4a16_sym_g128")
    session = NumpySession()
    problem = session.problem(spec, 256, 256)
    problem.select(3)
    calls = []

    def kernel(a, w, out, a_scale=None, bias=None, stream=None):
        calls.append(a.shape)
    assert problem.time(kernel, budget_ms=1.0).median_us == FAKE_US
    assert problem.rank(kernel, None, budget_ms=1.0, drop_ratio=1.5).median_us == FAKE_US
    assert calls == [(3, 256)] * 6


def test_full_check():
    spec = as_spec("awq_w4a16_g128")
    rng = np.random.default_rng(0)
    err, finite = workbench.full_check(NumpySession(), spec, NumpyKernel(spec), 5, 256, 256, rng)
    assert finite and err < tolerance(spec) / 4
    err, finite = workbench.full_check(NumpySession(), spec, NumpyKernel(spec, "last_tile"), 20,
                                       256, 256, rng)
    assert not finite


def test_full_check_compares_an_int32_output_as_integers(monkeypatch):
    """An int32 output against its exact sums, bit for bit: here 2^25 each
    (activations -128, weights -8, K = 2^15), where float32 holds only even
    integers and an output 1 off would round to the reference's value."""
    spec = as_spec("int8_int4_int32")
    M, N, K = 2, 8, 1 << 15
    tensors = {"qweight": encode_codes(spec, np.full((N, K), 8))}          # raw 8: int4 -8
    weights = (tensors, dequantize(spec, tensors, N, K))
    monkeypatch.setattr(workbench.random_data, "random_activation",
                        lambda spec, M, K, rng: (np.full((M, K), -128, np.int8), None))

    def kernel(a, w, out, a_scale=None, bias=None, stream=None, off=0):
        out[...] = reference_matmul(spec, a, w)
        assert out[0, 0] == 1 << 25
        out[0, 0] += off
    rng = np.random.default_rng(0)
    assert workbench.full_check(NumpySession(), spec, kernel, M, N, K, rng, weights) == (0.0, True)
    err, finite = workbench.full_check(NumpySession(), spec, partial(kernel, off=1), M, N, K, rng,
                                       weights)
    assert finite and err > tolerance(spec) == 0


class _Stream:
    """A CuPy stream's capture interface, recording the calls."""

    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")

    def __exit__(self, *exc):
        self.log.append("exit")

    def begin_capture(self):
        self.log.append("begin")

    def end_capture(self):
        self.log.append("end")
        return "graph"


def test_session_capture():
    """runtime.workbench.Session.capture: enqueue() inside a capture on the
    session's stream; a failure still ends the capture, then propagates."""
    log = []
    s = object.__new__(workbench.Session)
    s.stream = _Stream(log)
    assert s.capture(lambda: log.append("launch")) == "graph"
    assert log == ["enter", "begin", "launch", "end", "exit"]
    log.clear()

    def boom():
        raise RuntimeError("launch failed")
    with pytest.raises(RuntimeError, match="launch failed"):
        s.capture(boom)
    assert log == ["enter", "begin", "end", "exit"]

"""The GPU workbench shared by the tuner, `opgen bench` and the GPU tests: a
Session (cupy, one Timer on one stream, the loaded kernels) and, per (spec,
N, K), a Problem: the tiled random problem of tiled.py on the GPU, with
enough rotating copies of every input and output to defeat the L2, timing
(timing.Timer) and verification (poisoned output, checked rows against the
numpy reference, within codegen.tolerance).

A kernel here is anything called as runtime.kernel.Kernel is:
kernel(a, tensors, out, a_scale=None, bias=None, stream=None) on device
arrays; the tuner passes Kernels, the bench its ops (adapted).  A Problem
reaches the device only through its session, so tests put a numpy session
in its place.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from ..codegen import random_data, reference
from ..codegen.spec import INT_OUT_DTYPES, stored_shapes
from ..codegen.tolerance import output_error
from . import tiled
from .kernel import Kernel
from .timing import Timer, Timing, n_copies

MEM_CAP = 4 << 30        # most memory the rotating copies of one problem take


class Session:
    """The GPU side of a run: cupy, one Timer (one stream, one CUDA context)
    and the loaded kernels, shared by a spec's shapes and buckets."""

    base_limit = tiled.BASE_LIMIT

    def __init__(self, arch: str, timer: Optional[Timer] = None):
        import cupy
        self.xp, self.arch = cupy, arch
        self.timer = timer or Timer()
        self.stream = self.timer.stream
        self.kernels: dict = {}
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        self.l2 = int(props.get("l2CacheSize", 0)) or (60 << 20)

    def to_device(self, x):
        """numpy -> cupy.  Types cupy lacks (bfloat16, float8 as ml_dtypes) go
        over as their raw bits in an unsigned int of the same size."""
        if x is None:
            return None
        x = np.ascontiguousarray(x)
        if x.dtype.kind not in "biuf":
            x = x.view(f"u{x.dtype.itemsize}")
        return self.xp.asarray(x)

    def to_host(self, x) -> np.ndarray:
        return self.xp.asnumpy(x)

    def free_bytes(self) -> int:
        return int(self.xp.cuda.runtime.memGetInfo()[0])

    def synchronize(self) -> None:
        self.xp.cuda.Device().synchronize()

    def release(self) -> None:
        self.xp.get_default_memory_pool().free_all_blocks()

    def capture(self, enqueue):
        """A CUDA graph of what enqueue() launches on the session's stream,
        captured once (nothing runs); graph.launch(self.stream) replays it.
        Nothing may allocate while capturing: run enqueue() once before, on
        this stream (first calls load kernels and make split-K workspaces)."""
        s = self.stream
        with s:
            s.begin_capture()
            try:
                enqueue()
            except BaseException:
                try:
                    s.end_capture()          # leave capture mode; the graph is dropped
                except Exception:
                    pass
                raise
            return s.end_capture()

    def kernel(self, spec, cfg) -> Kernel:
        k = self.kernels.get((spec, cfg))
        if k is None:
            k = self.kernels[spec, cfg] = Kernel(spec, cfg, self.arch)
        return k

    def problem(self, spec, N: int, K: int, seed: int = 0, mem_cap: int = MEM_CAP) -> "Problem":
        return Problem(self, spec, N, K, seed, mem_cap)

    def forget(self, spec) -> None:
        """Unload spec's kernels, and with them their split-K workspaces."""
        for key in [k for k in self.kernels if k[0] == spec]:
            del self.kernels[key]
        self.release()

    def close(self) -> None:
        self.kernels.clear()
        self.release()


class Problem:
    """One (spec, N, K) on the GPU: the tiled random problem, timing and
    verification, M by M (select(M) first).

    Launch i uses the i % n-th of n rotating copies of every input and output
    (timing.n_copies: together over twice the L2), so a small problem does
    not find its data in L2; the weight copies are kept for every M."""

    def __init__(self, session, spec, N: int, K: int, seed: int = 0, mem_cap: int = MEM_CAP):
        self.session, self.xp = session, session.xp
        self.spec, self.N, self.K, self.seed, self.mem_cap = spec, N, K, seed, mem_cap
        self.N0, self.K0 = tiled.base_shape(spec, N, K, session.base_limit)
        self.base = tiled.base_weights(spec, self.N0, self.K0, seed)
        want = stored_shapes(spec, N, K)
        self.w_sets = [{k: tiled.tile_to(session.to_device(v), want[k], self.xp)
                        for k, v in self.base.tensors.items()}]
        self.bias = (None if self.base.bias is None else
                     tiled.tile_to(session.to_device(self.base.bias), (N,), self.xp))
        self.M = self.M0 = self.act = None
        self.acts = self.outs = self.check_out = None

    def select(self, M: int, input_dtype: Optional[str] = None) -> None:
        """Make M's buffers: the activation drawn at M0 x K0 and tiled to
        M x K, and enough rotating copies of every input and output.
        input_dtype: a float input (e.g. "float16") for a kernel that
        quantizes it itself, instead of spec.a's storage."""
        xp, dev = self.xp, self.session
        self.acts = self.outs = self.check_out = None           # the last M's, freed first
        self.M, self.M0 = M, tiled.base_rows(M)
        self.act = tiled.base_activation(self.spec, self.M0, self.K0, self.seed, input_dtype)
        a = tiled.tile_to(dev.to_device(self.act.input), (M, self.K), xp)
        s = (None if self.act.input_scale is None else
             tiled.tile_to(dev.to_device(self.act.input_scale), (M,), xp))
        out_dt = tiled.out_dtype(self.spec)
        per_copy = (sum(int(w.nbytes) for w in self.w_sets[0].values()) + int(a.nbytes)
                    + (0 if s is None else int(s.nbytes)) + M * self.N * np.dtype(out_dt).itemsize)
        n = n_copies(per_copy, dev.l2, min(self.mem_cap, dev.free_bytes() // 4))
        while len(self.w_sets) < n:
            self.w_sets.append({k: w.copy() for k, w in self.w_sets[0].items()})
        self.acts = [(a, s)] + [(a.copy(), None if s is None else s.copy()) for _ in range(n - 1)]
        self.outs = [xp.empty((M, self.N), dtype=out_dt) for _ in range(n)]
        self.check_out = xp.empty((M, self.N), dtype=out_dt)
        # Made on the default stream, which the timer's stream does not wait for.
        dev.synchronize()

    def close(self) -> None:
        self.w_sets = self.acts = self.outs = self.check_out = self.bias = None
        self.session.release()

    def launcher(self, kernel):
        """launch(i): kernel on the i % n-th copies, on the timer's stream."""
        acts, outs, w_sets, bias = self.acts, self.outs, self.w_sets, self.bias
        n, stream = len(acts), self.session.stream

        def launch(i):
            a, a_scale = acts[i % n]
            kernel(a, w_sets[i % n], outs[i % n], a_scale=a_scale, bias=bias, stream=stream)
        return launch

    def rank(self, kernel, best_us=None, *, budget_ms: float, drop_ratio: float) -> Timing:
        """A cheap time (Timer.rank), dropped if clearly slower than best_us."""
        return self.session.timer.rank(self.launcher(kernel), best_us, budget_us=budget_ms * 1e3,
                                       drop_ratio=drop_ratio)

    def time(self, kernel, *, estimate_us=None, budget_ms: float, repeats=None) -> Timing:
        """A full time (Timer.measure)."""
        return self.session.timer.measure(self.launcher(kernel), None, budget_us=budget_ms * 1e3,
                                          repeats=repeats, estimate_us=estimate_us)

    def verify(self, kernel, tol: float) -> Tuple[bool, float, str]:
        """(ok, error (tolerance.output_error), why not) of kernel on the first
        input set: the output is poisoned with NaN first and must come back finite everywhere
        (every element written), and its checked rows (tiled.check_rows_of:
        the first, middle and last m-tiles) must match the reference within
        tol (tiled.check_rows)."""
        xp, dev, spec, out = self.xp, self.session, self.spec, self.check_out
        a, a_scale = self.acts[0]
        rows = tiled.check_rows_of(self.M)
        try:
            with dev.stream:
                out.fill(tiled.poison(spec))
                kernel(a, self.w_sets[0], out, a_scale=a_scale, bias=self.bias, stream=dev.stream)
                bad = tiled.nonfinite(spec, out, xp)
                got = tiled.out_to_f32(spec, dev.to_host(out[xp.asarray(rows)]))
        except Exception as e:
            return False, math.inf, f"launch failed: {type(e).__name__}: {e}"
        if bad:
            return False, math.inf, f"{bad} of {out.size} outputs NaN/Inf (unwritten or overflowed)"
        base = rows % self.M0
        s_rows = None if self.act.a_scale is None else self.act.a_scale[base]
        r = tiled.check_rows(spec, self.act.a[base], s_rows, self.base.real, self.base.bias, got,
                             self.N, self.K, self.N0, self.K0, tol=tol)
        err = math.inf if r["rel_err"] is None else r["rel_err"]
        return r["verified"], err, r.get("verify_msg", "")


def full_check(session, spec, kernel, M: int, N: int, K: int, rng: np.random.Generator,
               weights=None) -> Tuple[float, bool]:
    """(error (tolerance.output_error), every output finite) of kernel on a
    fresh random problem at the full shape, no tiling (the GPU tests'
    check): the output poisoned first, compared whole with
    reference_matmul_f32 (an int32 output: with reference_matmul's exact
    sums, as integers).  weights: (tensors, their dequantized values) to
    reuse, else drawn from rng."""
    if weights is None:
        tensors = random_data.random_weight_tensors(spec, N, K, rng)
        weights = (tensors, reference.dequantize(spec, tensors, N, K))
    tensors, w_real = weights
    a, a_scale = random_data.random_activation(spec, M, K, rng)
    bias = random_data.random_bias(spec, N, rng) if spec.epilogue.bias else None
    xp, dev = session.xp, session.to_device
    out = xp.full((M, N), tiled.poison(spec), dtype=tiled.out_dtype(spec))
    kernel(dev(a), {k: dev(v) for k, v in tensors.items()}, out, a_scale=dev(a_scale),
           bias=dev(bias))
    session.synchronize()
    host = session.to_host(out)
    if spec.out.dtype in INT_OUT_DTYPES:
        # In int64, not float32, which holds the sums exactly only below 2^24
        # (an output 1 off would round to the reference's value): the error
        # is 0 only where every output equals its sum.
        ref = reference.reference_matmul(spec, a, tensors, a_scale=a_scale).astype(np.int64)
        got = host.astype(np.int64)
    else:
        ref = reference.reference_matmul_f32(spec, a, tensors, a_scale=a_scale, bias=bias,
                                             w_real=w_real)
        got = tiled.out_to_f32(spec, host).astype(np.float64)
    return output_error(spec, got, ref), tiled.nonfinite(spec, host) == 0

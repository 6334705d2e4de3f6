"""The empirical tuner: time every candidate tile config on the GPU, keep the
fastest one that computes the right answer, store it in the tuning DB.

For each M bucket (see buckets.py) the tuner
  1. asks the planner for the candidates at the bucket's representative M,
  2. compiles all unique configs of all buckets at once, in parallel worker
     processes (NVRTC is CPU-bound and single-threaded); configs that raise
     CompileError (e.g. too many registers or too much shared memory) are
     dropped and counted,
  3. times the heuristic's pick first, then every other candidate, with CUDA
     events (see _Timer.measure for how the numbers are kept honest),
  4. verifies each new fastest config against the reference on a fresh
     random problem as it is found, so a wrong one is reported and the
     winner is the fastest correct config,
  5. writes every bucket's winner to the DB in one locked update.

The planner, compiler, kernel, reference and device modules are imported
inside small wrappers, so this module imports without a GPU and tests can
replace them.

Compilation uses 'spawn' worker processes: a script calling tune() must guard
its top level with `if __name__ == "__main__":` (as with any multiprocessing).
"""
from __future__ import annotations

import math
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .buckets import LABELS, bucket_of, representative_M
from .tuning_db import TuningDB, format_table, make_key, make_record, speedup

# Timing policy (see _Timer.measure).
BUDGET_MS = 30.0          # measured device time per config
MIN_SAMPLE_US = 20.0      # one sample spans >= this, far above the event resolution (~0.5 us)
EARLY_SAMPLES = 3         # samples taken before deciding whether to drop a slow config
MIN_SAMPLES, MAX_SAMPLES = 5, 100
CHUNK_SAMPLES = 25        # samples enqueued behind one spin
DROP_RATIO = 1.5          # drop a config this much slower than the best so far
N_RUNNER_UP = 3


# --- the lead's modules (imported late) -----------------------------------------------

def _candidates(spec, arch, M, N, K):
    from opgen.codegen.planner import candidates
    return list(candidates(spec, arch, M, N, K))


def _heuristic(spec, arch, M, N, K):
    from opgen.codegen.planner import heuristic
    return heuristic(spec, arch, M, N, K)


def _device_info(arch: Optional[str]) -> Tuple[str, str, str]:
    from .device import current_arch, device_name, nvrtc_version
    return arch or current_arch(), device_name(), nvrtc_version()


def _compile_one(spec, config, arch, N, K) -> Optional[str]:
    """Runs in a worker process: None when the config compiled (the compiler
    keeps the cubin in its disk cache for Kernel to load), else why not."""
    from opgen.runtime.compiler import CompileError, compile_cubin
    try:
        compile_cubin(spec, config, arch, N, K)
    except CompileError as e:
        return f"CompileError: {e}"
    return None


def _make_bench(spec, arch, N, K, M, seed):
    return _Bench(spec, arch, N, K, M, seed=seed)


# --- accuracy --------------------------------------------------------------------------

# Unit roundoff (half an ulp, relative) of the types a kernel rounds through.
_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
             "float8_e4m3": 2.0 ** -4,
             # int8 activations: the products may be exact (int8 MMA) but a kernel
             # may as well dequantize the weights to fp16 and convert the int8
             # activations (exact in fp16), so allow fp16's rounding.
             "int8": 2.0 ** -11}


def tolerance(spec) -> float:
    """Largest accepted ||out - ref|| / ||ref|| (Frobenius) against the float32
    reference.

    A kernel rounds in two places the reference need not: the MMA operands
    (dequantized weights are rounded to the activation dtype, e.g. (q - z) * s
    to fp16) and the output store (to out dtype).  Each rounding to a type of
    unit roundoff u adds a relative error of RMS about u / sqrt(3) on random
    data (independent errors over K add up like the signal does), so the
    expected error is below 0.6 * (u_operand + u_out).  Allowing
    2 * (u_operand + u_out) (+ 1e-5 for float32 summation order) keeps a margin
    of more than 3x, yet every real bug (a wrong scale, zero point, group, tile
    or unwritten output) gives errors of order 0.1 to 1, far above it:
        fp16 in, fp16 out: 2.0e-3     bf16 in, bf16 out: 1.6e-2
        fp16 in, fp32 out: 1.0e-3     int8 in, fp16 out: 2.0e-3
    (fp32 out with fp16 inputs is not held to ~1e-4 because the reference may
    keep the dequantized weights in float32 while the MMA needs fp16.)
    """
    u_in = _ROUNDOFF.get(spec.a.dtype, _ROUNDOFF["bfloat16"])
    u_out = _ROUNDOFF[spec.out.dtype]
    return 2.0 * (u_in + u_out) + 1e-5


# --- results ---------------------------------------------------------------------------

class TuneResults(dict):
    """{bucket: record} as stored in the DB, plus what went wrong on the way."""

    def __init__(self, key):
        super().__init__()
        self.key = key
        self.compile_failed: Dict[str, str] = {}          # config name -> why
        self.launch_failed: Dict[str, str] = {}           # config name -> why
        self.verify_failed: Dict[str, List[Tuple[str, str]]] = {}  # bucket -> [(name, why)]
        self.untuned: Dict[str, str] = {}                 # bucket -> why no record


@dataclass
class Timing:
    median_us: float
    samples: List[float]
    dropped: bool = False          # stopped early: clearly slower than the best


@dataclass
class _BucketPlan:
    bucket: str
    M: int
    candidates: list
    heuristic: object


# --- progress --------------------------------------------------------------------------

class _Progress:
    """One status line on stderr, redrawn in place ('\\r') on a terminal; on a
    pipe only the milestones are printed, one per line."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._width = 0
        self._last = 0.0

    def show(self, text: str, milestone: bool = False) -> None:
        if not self.enabled:
            return
        if not self.tty:
            if milestone:
                print(text, file=self.stream, flush=True)
            return
        now = time.monotonic()
        if not milestone and now - self._last < 0.05:     # redraw at most 20x a second
            return
        self._last = now
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def log(self, text: str) -> None:
        """A line of its own (a note that must stay visible)."""
        if not self.enabled:
            return
        self.end()
        print(text, file=self.stream, flush=True)

    def end(self) -> None:
        if self.enabled and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0

    @staticmethod
    def bar(done: int, total: int, width: int = 20) -> str:
        k = width * done // max(total, 1)
        return "[" + "#" * k + "-" * (width - k) + "]"


# --- compiling -------------------------------------------------------------------------

def _compile_all(spec, configs: Sequence, arch, N, K, workers: int, prog: _Progress,
                 fn=None) -> Dict[object, Optional[str]]:
    """{config: None if it compiled, else why not}.  fn (default _compile_one)
    must be a module-level function so that worker processes can import it."""
    fn = fn or _compile_one
    status: Dict[object, Optional[str]] = {}

    def done(cfg, why):
        status[cfg] = why
        failed = sum(w is not None for w in status.values())
        prog.show(f"compile {prog.bar(len(status), len(configs))} {len(status)}/{len(configs)}"
                  f"  failed {failed}", milestone=len(status) == len(configs))

    if workers <= 1 or len(configs) <= 1:
        for cfg in configs:
            try:
                done(cfg, fn(spec, cfg, arch, N, K))
            except Exception as e:                 # a compiler bug: drop, but say so
                done(cfg, f"{type(e).__name__}: {e}")
        return status
    # 'spawn': the parent may hold a CUDA context, which must not be forked.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(configs)), mp_context=ctx) as ex:
        futures = {ex.submit(fn, spec, cfg, arch, N, K): cfg for cfg in configs}
        for fut in as_completed(futures):
            try:
                why = fut.result()
            except Exception as e:                 # incl. a crashed worker (BrokenProcessPool)
                why = f"{type(e).__name__}: {e}"
            done(futures[fut], why)
    return status


# --- tuning ----------------------------------------------------------------------------

def _plan(spec, arch, N, K, Ms) -> List[_BucketPlan]:
    if Ms is None:
        Ms = [representative_M(label) for label in LABELS]
    chosen: Dict[str, int] = {}
    for M in Ms:
        b = bucket_of(int(M))
        if b in chosen:
            warnings.warn(f"M={M} falls in bucket {b} like M={chosen[b]}; tuning M={chosen[b]} only")
            continue
        chosen[b] = int(M)
    plans = []
    for b, M in chosen.items():
        cands = list(dict.fromkeys(_candidates(spec, arch, M, N, K)))     # dedupe, keep order
        plans.append(_BucketPlan(b, M, cands, _heuristic(spec, arch, M, N, K)))
    return plans


def _name(cfg) -> str:
    return str(getattr(cfg, "name", cfg))


def tune(spec, N: int, K: int, Ms: Optional[Sequence[int]] = None, arch: Optional[str] = None,
         db=None, workers: Optional[int] = None, repeats: Optional[int] = None,
         progress: bool = True, *, budget_ms: float = BUDGET_MS, drop_ratio: float = DROP_RATIO,
         seed: int = 0) -> TuneResults:
    """Tune `spec` at N, K for the buckets of `Ms` (default: every bucket at its
    representative M) on the current GPU; store and return {bucket: record}.

    db: a TuningDB, a path, or None for the default DB.  workers: compile
    processes (default os.cpu_count()).  repeats: samples per config (default:
    adaptive, about budget_ms of device time each).
    """
    arch, device, nvrtc = _device_info(arch)
    if not isinstance(db, TuningDB):
        db = TuningDB(db)
    key = make_key(spec, N, K, arch=arch, device=device, nvrtc=nvrtc)
    results = TuneResults(key)
    prog = _Progress(progress)

    plans = _plan(spec, arch, N, K, Ms)
    configs = list(dict.fromkeys(c for p in plans for c in [p.heuristic, *p.candidates]))
    status = _compile_all(spec, configs, arch, N, K, workers or os.cpu_count() or 1, prog)
    results.compile_failed = {_name(c): why for c, why in status.items() if why is not None}
    compiled = {c for c, why in status.items() if why is None}
    prog.end()
    if results.compile_failed:
        prog.log(f"{len(results.compile_failed)} of {len(configs)} configs did not compile "
                 f"(e.g. {next(iter(results.compile_failed.items()))})")
        odd = {n: w for n, w in results.compile_failed.items() if not w.startswith("CompileError")}
        if odd:
            warnings.warn(f"{len(odd)} config(s) failed to compile with an unexpected error, "
                          f"e.g. {next(iter(odd.items()))}")

    for plan in plans:
        rec = _tune_bucket(spec, arch, N, K, plan, compiled, results, prog,
                           repeats=repeats, budget_ms=budget_ms, drop_ratio=drop_ratio, seed=seed)
        prog.end()
        if rec is not None:
            results[plan.bucket] = rec
    if results:
        db.put_many((key, b, rec) for b, rec in results.items())
    for b, why in results.untuned.items():
        warnings.warn(f"bucket {b}: no config stored ({why})")
    return results


def _tune_bucket(spec, arch, N, K, plan: _BucketPlan, compiled, results: TuneResults,
                 prog: _Progress, *, repeats, budget_ms, drop_ratio, seed) -> Optional[dict]:
    heur = plan.heuristic
    order = [c for c in dict.fromkeys([heur, *plan.candidates]) if c in compiled]
    if not order:
        results.untuned[plan.bucket] = "no candidate compiled"
        return None
    tol = tolerance(spec)
    bench = _make_bench(spec, arch, N, K, plan.M, seed)
    try:
        timings: Dict[object, Timing] = {}
        rejected: List[Tuple[str, str]] = []
        best = best_err = None
        for i, cfg in enumerate(order, 1):
            try:
                # The heuristic comes first and is timed in full (never dropped):
                # its time is the baseline stored with the record.
                t = bench.time(cfg, best_us=None if cfg == heur or best is None
                               else timings[best].median_us,
                               budget_ms=budget_ms, repeats=repeats, drop_ratio=drop_ratio)
            except Exception as e:
                results.launch_failed[_name(cfg)] = f"{type(e).__name__}: {e}"
                continue
            timings[cfg] = t
            if not t.dropped and (best is None or t.median_us < timings[best].median_us):
                # Verify every new best at once, not only the final winner: a wrong
                # kernel (say one that skips work) would otherwise be the yardstick
                # that gets correct configs dropped early.  Rejecting it here makes
                # the next fastest correct config the winner.
                ok, err, why = bench.verify(cfg, tol)
                if ok:
                    best, best_err = cfg, err
                else:
                    rejected.append((_name(cfg), why))
            best_txt = (f"best {timings[best].median_us:.2f} us ({_name(best)})"
                        if best is not None else "")
            prog.show(f"tune {spec.name} [{plan.bucket} M={plan.M}] {prog.bar(i, len(order))} "
                      f"{i}/{len(order)} configs  {best_txt}", milestone=i == len(order))
        if rejected:
            results.verify_failed[plan.bucket] = rejected
            prog.log(f"bucket {plan.bucket}: {len(rejected)} config(s) failed verification "
                     f"(tolerance {tol:.1e}): " + "; ".join(f"{n}: {w}" for n, w in rejected))
        if best is None:
            results.untuned[plan.bucket] = ("no candidate could be launched" if not timings else
                                            "every candidate timed failed verification")
            return None

        bad = {n for n, _ in rejected}
        runner_up = sorted(t.median_us for c, t in timings.items()
                           if c != best and _name(c) not in bad and not t.dropped)[:N_RUNNER_UP]
        extra = {"rel_err": float(f"{best_err:.3g}")}
        if rejected:
            extra["rejected"] = [n for n, _ in rejected]
        return make_record(best.to_dict(), timings[best].median_us, M=plan.M,
                           runner_up_us=runner_up,
                           heuristic_us=timings[heur].median_us if heur in timings else None,
                           config_name=_name(best), **extra)
    finally:
        bench.close()


# --- the GPU side ----------------------------------------------------------------------

_SPIN_SRC = r"""
extern "C" __global__ void opgen_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def _to_device(x):
    """numpy -> cupy.  Types cupy lacks (bfloat16, float8 as ml_dtypes) go over
    as their raw bits in an unsigned int of the same size."""
    import cupy as cp
    if x is None:
        return None
    x = np.ascontiguousarray(x)
    if x.dtype.kind not in "biuf":
        x = x.view(f"u{x.dtype.itemsize}")
    return cp.asarray(x)


def _out_dtype(spec):
    # bfloat16 output is kept as its bits (cupy has no bfloat16).
    return {"float16": np.float16, "float32": np.float32, "bfloat16": np.uint16}[spec.out.dtype]


def _poison(spec):
    return 0x7FC0 if spec.out.dtype == "bfloat16" else np.nan       # a NaN in every out dtype


def _out_to_f32(spec, host: np.ndarray) -> np.ndarray:
    if spec.out.dtype == "bfloat16":
        return (host.astype(np.uint32) << 16).view(np.float32)
    return host.astype(np.float32)


def _random_bias(spec, N, rng):
    """A bias in the out dtype's storage (bfloat16 as uint16 bits), with values
    k/8 in [-2, 2] that every output dtype holds exactly."""
    from opgen.codegen.numerics import to_storage
    return to_storage(rng.integers(-16, 17, size=N).astype(np.float32) / 8, spec.out.dtype)


@dataclass
class _Problem:
    """One set of kernel inputs (host numpy or device cupy arrays)."""
    a: object
    a_scale: object
    tensors: dict
    bias: object

    @classmethod
    def random(cls, spec, M, N, K, rng) -> "_Problem":
        from opgen.codegen.reference import random_activation, random_weight_tensors
        tensors = random_weight_tensors(spec, N, K, rng)
        a, a_scale = random_activation(spec, M, K, rng)
        bias = _random_bias(spec, N, rng) if spec.epilogue.bias else None
        return cls(a, a_scale, dict(tensors), bias)

    def to_device(self) -> "_Problem":
        return _Problem(_to_device(self.a), _to_device(self.a_scale),
                        {k: _to_device(v) for k, v in self.tensors.items()}, _to_device(self.bias))

    def arrays(self):
        return [x for x in (self.a, self.a_scale, self.bias, *self.tensors.values()) if x is not None]

    def nbytes(self) -> int:
        return sum(int(x.nbytes) for x in self.arrays())

    def clone(self) -> "_Problem":
        def cp(x):
            return None if x is None else x.copy()
        return _Problem(cp(self.a), cp(self.a_scale), {k: cp(v) for k, v in self.tensors.items()},
                        cp(self.bias))


def _n_copies(per_copy: int, l2: int, cap: int) -> int:
    """How many input/output sets to rotate through.  Launch i uses set
    i % n, so a set was last touched n - 1 launches ago; with all sets
    together over twice the L2 it has been evicted by then, as in a real model
    where the weights of the other layers pass through L2 in between.  A set
    larger than the L2 evicts itself, but two sets still avoid re-reading the
    tail of the previous launch.  Memory use stays under `cap`."""
    want = max(2, math.ceil(2 * l2 / max(per_copy, 1)))
    return max(1, min(want, cap // max(per_copy, 1), 4096))


class _Timer:
    """CUDA-event timing of a launch function on one stream (see measure)."""

    def __init__(self, stream=None):
        import cupy as cp
        self.cp = cp
        self.stream = stream or cp.cuda.Stream(non_blocking=True)
        self._spin = cp.RawKernel(_SPIN_SRC, "opgen_spin")
        dev = cp.cuda.Device()
        khz = dev.attributes.get("ClockRate", 0) or \
            cp.cuda.runtime.getDeviceProperties(dev.id).get("clockRate", 0)
        self.clock_khz = int(khz) or 2_000_000

    def measure(self, launch, best_us=None, *, budget_us=BUDGET_MS * 1e3, repeats=None,
                drop_ratio=DROP_RATIO) -> Timing:
        """Median device time of one launch(i), in microseconds; launch(i)
        enqueues one launch on self.stream (i counts up, to rotate buffers).

        * Warm-up launches first: the first one loads the module.
        * Python enqueues a launch in several microseconds, often slower than
          a decode kernel runs; timed naively the GPU would wait on the CPU and
          we would measure Python.  So each group of samples is enqueued behind
          a spin kernel that keeps the GPU busy until the CPU is far enough
          ahead; the launches then run back to back, as in a CUDA graph.
        * One sample = the CUDA-event time of L consecutive launches / L, with
          L chosen so a sample spans >= MIN_SAMPLE_US, well above the event
          resolution; the median of the samples resists interruptions.
        * The number of samples fits a time budget; after EARLY_SAMPLES a
          config slower than drop_ratio * best_us is abandoned (dropped=True).
        """
        with self.stream:
            return self._measure(launch, best_us, budget_us, repeats, drop_ratio)

    def _measure(self, launch, best_us, budget_us, repeats, drop_ratio) -> Timing:
        s = self.stream
        i = 0
        for _ in range(3):
            launch(i)
            i += 1
        s.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            launch(i)
            i += 1
        host_us = (time.perf_counter() - t0) / 5 * 1e6
        s.synchronize()
        gpu_us = self._samples(launch, i, 1, 5, host_us, 0.0)[0]
        i += 5

        L = max(1, math.ceil(MIN_SAMPLE_US / max(gpu_us, 1e-3)))
        if repeats:
            R = int(repeats)
        else:
            R = int(budget_us / (L * max(gpu_us, host_us, 1e-3)))
            R = min(max(R, MIN_SAMPLES), MAX_SAMPLES)
        samples = self._samples(launch, i, min(R, EARLY_SAMPLES), L, host_us, gpu_us)
        i += len(samples) * L
        if best_us is not None and statistics.median(samples) > drop_ratio * best_us:
            return Timing(statistics.median(samples), samples, dropped=True)
        while len(samples) < R:
            k = min(CHUNK_SAMPLES, R - len(samples))
            samples += self._samples(launch, i, k, L, host_us, gpu_us)
            i += k * L
        return Timing(statistics.median(samples), samples)

    def _samples(self, launch, start, count, L, host_us, gpu_us) -> List[float]:
        cp, s = self.cp, self.stream
        # The GPU finishes launch j at spin + j * gpu_us and the CPU enqueues it
        # at j * host_us: the spin must cover the difference (plus margin).
        lag_us = count * L * max(0.0, host_us - gpu_us) + count * 10.0 + host_us
        spin_us = 1.5 * lag_us + 20.0
        self._spin((1,), (1,), (np.int64(spin_us * self.clock_khz / 1e3),))
        events = [cp.cuda.Event() for _ in range(count + 1)]
        events[0].record(s)
        j = start
        for k in range(count):
            for _ in range(L):
                launch(j)
                j += 1
            events[k + 1].record(s)
        events[-1].synchronize()
        return [cp.cuda.get_elapsed_time(events[k], events[k + 1]) * 1e3 / L for k in range(count)]


class _Bench:
    """Rotating buffers, timing and verification for one (spec, N, K, M) on the GPU."""

    def __init__(self, spec, arch, N, K, M, *, seed=0, mem_cap=2 << 30):
        import cupy as cp
        self.cp = cp
        self.spec, self.arch, self.N, self.K, self.M = spec, arch, N, K, M
        self.seed = seed
        l2 = int(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id).get("l2CacheSize", 0))
        free, _ = cp.cuda.runtime.memGetInfo()

        base = _Problem.random(spec, M, N, K, np.random.default_rng(seed)).to_device()
        out_bytes = M * N * np.dtype(_out_dtype(spec)).itemsize
        n = _n_copies(base.nbytes() + out_bytes, l2 or (60 << 20), min(mem_cap, free // 4))
        self.sets = [base] + [base.clone() for _ in range(n - 1)]
        self.outs = [cp.empty((M, N), dtype=_out_dtype(spec)) for _ in range(n)]
        self.timer = _Timer()
        self.stream = self.timer.stream
        self._kernels: dict = {}
        self._check = None          # (device problem, row indices, reference rows), made lazily

    def close(self) -> None:
        self.sets = self.outs = None
        self._kernels.clear()
        self._check = None
        self.cp.get_default_memory_pool().free_all_blocks()

    def _kernel(self, cfg):
        if cfg not in self._kernels:
            from opgen.runtime.kernel import Kernel
            self._kernels[cfg] = Kernel(self.spec, cfg, self.arch)
        return self._kernels[cfg]

    def time(self, cfg, best_us=None, *, budget_ms=BUDGET_MS, repeats=None,
             drop_ratio=DROP_RATIO) -> Timing:
        kernel = self._kernel(cfg)
        sets, outs, s, n = self.sets, self.outs, self.stream, len(self.sets)

        def launch(i):
            p = sets[i % n]
            kernel(p.a, p.tensors, outs[i % n], a_scale=p.a_scale, bias=p.bias, stream=s)
        return self.timer.measure(launch, best_us, budget_us=budget_ms * 1e3, repeats=repeats,
                                  drop_ratio=drop_ratio)

    # verification
    def _check_problem(self):
        """A fresh random problem (another seed than the timed one) and the
        reference for a subset of its rows: all rows up to 256, else the first
        and last 128 (edge tiles) and 64 in between.  Made once per bucket."""
        if self._check is None:
            from opgen.codegen.reference import reference_matmul_f32
            M = self.M
            rng = np.random.default_rng(self.seed + 7919)
            host = _Problem.random(self.spec, M, self.N, self.K, rng)
            if M <= 256:
                rows = np.arange(M)
            else:
                mid = rng.choice(np.arange(128, M - 128), size=min(64, M - 256), replace=False)
                rows = np.unique(np.concatenate([np.arange(128), np.sort(mid), np.arange(M - 128, M)]))
            a_scale = None if host.a_scale is None else np.asarray(host.a_scale)[rows]
            ref = reference_matmul_f32(self.spec, np.asarray(host.a)[rows], host.tensors,
                                       a_scale=a_scale, bias=host.bias)
            self._check = (host.to_device(), rows, np.asarray(ref, dtype=np.float64))
        return self._check

    def verify(self, cfg, tol: float) -> Tuple[bool, float, str]:
        """(ok, relative error, why not) of cfg on the check problem; the output
        is poisoned with NaN first so that unwritten elements show."""
        cp = self.cp
        dev, rows, ref = self._check_problem()
        out = cp.full((self.M, self.N), _poison(self.spec), dtype=_out_dtype(self.spec))
        try:
            with self.stream:
                self._kernel(cfg)(dev.a, dev.tensors, out, a_scale=dev.a_scale, bias=dev.bias,
                                  stream=self.stream)
            self.stream.synchronize()
        except Exception as e:
            return False, math.inf, f"launch failed: {type(e).__name__}: {e}"
        got = _out_to_f32(self.spec, cp.asnumpy(out))
        finite = np.isfinite(got)
        if not finite.all():
            return False, math.inf, f"{int((~finite).sum())} of {got.size} outputs NaN/Inf " \
                                    "(unwritten or overflowed)"
        err = float(np.linalg.norm(got[rows].astype(np.float64) - ref)
                    / max(np.linalg.norm(ref), 1e-30))
        if err > tol:
            return False, err, f"relative error {err:.2e} > {tol:.1e}"
        return True, err, ""


# --- `opgen tune` ------------------------------------------------------------------------

def _int_list(text: str) -> List[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"expected positive integers, got {text!r}")
    return vals


def add_cli(subparsers) -> None:
    """Add `opgen tune SPEC --N --K [--M 1,16,64] [--db PATH]`; sets args.func."""
    import argparse

    def int_list(text):
        try:
            return _int_list(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    p = subparsers.add_parser("tune", help="tune tile configs on this GPU and store the winners")
    p.add_argument("spec", help="spec name or YAML file")
    p.add_argument("--N", type=int, required=True)
    p.add_argument("--K", type=int, required=True)
    p.add_argument("--M", type=int_list, default=None,
                   help="comma-separated M values (default: every bucket at its representative M)")
    p.add_argument("--db", help="tuning DB file (default: $OPGEN_TUNING_DB or ~/.cache/opgen/tuning.json)")
    p.add_argument("--workers", type=int, default=None, help="compile processes (default: all cores)")
    p.add_argument("--repeats", type=int, default=None, help="samples per config (default: adaptive)")
    p.add_argument("--budget-ms", type=float, default=BUDGET_MS, help="device time per config")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=_cli_tune)


def _cli_tune(args) -> int:
    from opgen.codegen.validate import load_spec, resolve_spec
    spec = load_spec(resolve_spec(args.spec))
    res = tune(spec, args.N, args.K, Ms=args.M, db=args.db, workers=args.workers,
               repeats=args.repeats, progress=not args.quiet, budget_ms=args.budget_ms)
    rows = [[b, r["M"], r.get("config_name", ""), r["median_us"], r.get("heuristic_us"),
             speedup(r)] for b, r in res.items()]
    print(format_table(["bucket", "M", "best config", "us", "heuristic us", "speedup"], rows))
    db = args.db or TuningDB().path
    print(f"\nstored {len(res)} record(s) under {res.key} in {db}")
    if res.compile_failed:
        print(f"{len(res.compile_failed)} config(s) did not compile")
    if res.launch_failed:
        print(f"{len(res.launch_failed)} config(s) failed to launch: "
              + "; ".join(f"{n}: {w}" for n, w in list(res.launch_failed.items())[:3]))
    for b, why in res.untuned.items():
        print(f"bucket {b}: NOT tuned ({why})")
    return 1 if res.untuned else 0

"""The empirical tuner: time every candidate tile config on the GPU, keep the
fastest one that computes the right answer, store it in the tuning DB.

For each M bucket (see buckets.py) the tuner
  1. asks the planner for the candidates at the bucket's representative M,
  2. compiles all unique configs of all buckets at once, in parallel worker
     processes (NVRTC is CPU-bound and single-threaded); configs that raise
     CompileError (e.g. too many registers or too much shared memory) are
     dropped and counted,
  3. times the heuristic's pick first, then every other candidate, with CUDA
     events (see timing.Timer.measure for how the numbers are kept honest),
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

import functools
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .buckets import LABELS, bucket_of, representative_M
from .timing import BUDGET_MS, DROP_RATIO, Timer, Timing, n_copies
from .tuning_db import TuningDB, format_table, make_key, make_record, speedup

# Timing policy: see timing.py (BUDGET_MS: device time per config, DROP_RATIO:
# drop a config this much slower than the best so far).
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


def _compile_many(jobs, workers):
    """compiler.compile_many: compiles (spec, config, arch) jobs into the cubin
    cache (where Kernel loads them from), yielding (job, None | why not) as
    each finishes; in 'spawn' worker processes when workers > 1."""
    from opgen.runtime.compiler import compile_many
    return compile_many(jobs, workers)


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

def _compile_all(spec, configs: Sequence, arch, workers: int,
                 prog: _Progress) -> Dict[object, Optional[str]]:
    """{config: None if it compiled, else why not}, through _compile_many."""
    status: Dict[object, Optional[str]] = {}

    def done(cfg, why):
        status[cfg] = why
        failed = sum(w is not None for w in status.values())
        prog.show(f"compile {prog.bar(len(status), len(configs))} {len(status)}/{len(configs)}"
                  f"  failed {failed}", milestone=len(status) == len(configs))

    if workers <= 1 or len(configs) <= 1:
        # In this process, one config at a time: an unexpected exception (a
        # compiler bug) drops that config only.  (In worker processes every
        # exception comes back as the why.)
        for cfg in configs:
            try:
                for _, why in _compile_many([(spec, cfg, arch)], 1):
                    done(cfg, why)
            except Exception as e:                 # a compiler bug: drop, but say so
                done(cfg, f"{type(e).__name__}: {e}")
        return status
    for (_, cfg, _), why in _compile_many([(spec, cfg, arch) for cfg in configs], workers):
        done(cfg, why)
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
    status = _compile_all(spec, configs, arch, workers or os.cpu_count() or 1, prog)
    results.compile_failed = {_name(c): why for c, why in status.items() if why is not None}
    compiled = {c for c, why in status.items() if why is None}
    prog.end()
    if results.compile_failed:
        prog.log(f"{len(results.compile_failed)} of {len(configs)} configs did not compile "
                 f"(e.g. {next(iter(results.compile_failed.items()))})")
        odd = {n: w for n, w in results.compile_failed.items()
               if not w.startswith(("CompileError", "PlanError"))}
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


@functools.lru_cache(maxsize=2)
def _weights(spec, N, K, seed):
    from opgen.codegen.reference import random_weight_tensors
    return random_weight_tensors(spec, N, K, np.random.default_rng(seed))


@dataclass
class _Problem:
    """One set of kernel inputs (host numpy or device cupy arrays)."""
    a: object
    a_scale: object
    tensors: dict
    bias: object

    @classmethod
    def random(cls, spec, M, N, K, rng) -> "_Problem":
        """Random weights drawn once per (spec, N, K, weight seed) and shared by
        every bucket of a tuning run (numpy takes seconds for an 8192^2 weight);
        activations and bias fresh from rng."""
        from opgen.codegen.reference import random_activation, random_bias
        tensors = _weights(spec, N, K, int(rng.integers(0, 4)))
        a, a_scale = random_activation(spec, M, K, rng)
        bias = random_bias(spec, N, rng) if spec.epilogue.bias else None
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
        n = n_copies(base.nbytes() + out_bytes, l2 or (60 << 20), min(mem_cap, free // 4))
        self.sets = [base] + [base.clone() for _ in range(n - 1)]
        self.outs = [cp.empty((M, N), dtype=_out_dtype(spec)) for _ in range(n)]
        self.timer = Timer()
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
    t0 = time.perf_counter()
    res = tune(spec, args.N, args.K, Ms=args.M, db=args.db, workers=args.workers,
               repeats=args.repeats, progress=not args.quiet, budget_ms=args.budget_ms)
    elapsed = time.perf_counter() - t0
    rows = [[b, r["M"], r.get("config_name", ""), r["median_us"], r.get("heuristic_us"),
             speedup(r)] for b, r in res.items()]
    print(format_table(["bucket", "M", "best config", "us", "heuristic us", "speedup"], rows))
    db = args.db or TuningDB().path
    print(f"\nstored {len(res)} record(s) under {res.key} in {db}")
    print(f"tuned {len(res)} bucket(s) in {elapsed:.1f} s (compile + timing + verification)")
    if res.compile_failed:
        print(f"{len(res.compile_failed)} config(s) did not compile")
    if res.launch_failed:
        print(f"{len(res.launch_failed)} config(s) failed to launch: "
              + "; ".join(f"{n}: {w}" for n, w in list(res.launch_failed.items())[:3]))
    for b, why in res.untuned.items():
        print(f"bucket {b}: NOT tuned ({why})")
    return 1 if res.untuned else 0

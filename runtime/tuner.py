"""The empirical tuner: time the planner's candidate tile configs on the GPU,
keep the fastest one that computes the right answer, store it in the tuning DB.

One run tunes any number of (spec, N x K) pairs, each for a set of M buckets
(see buckets.py), in one process with one CUDA context:
  1. the planner's candidates and its heuristic pick for every bucket of
     every pair;
  2. every unique kernel of the whole run (the (spec, config) launch stages,
     planner.stages) submitted at once to one pool of worker processes (NVRTC
     is CPU-bound and single-threaded), in the order the specs are timed:
     the GPU times a spec as soon as its kernels are done, while the later
     ones compile; configs that raise CompileError or PlanError (e.g. too
     many registers or too much shared memory) are dropped and counted;
  3. per pair, one random problem on the GPU, drawn in numpy at a small base
     shape and tiled up (opgen/bench/verify.py), so no host work scales with
     N * K; per bucket, in two passes (see timing.Timer for how each number
     is kept honest):
       rank:  every compiled candidate, the heuristic's pick first, on a short
              budget (Timer.rank); one clearly slower than the best so far
              is dropped after its first sample;
       final: the heuristic's pick and the `finalists` fastest of the rank
              pass, again on the full budget (Timer.measure); the winner is
              the fastest correct one of these, so it is never slower than
              the heuristic's pick as measured in the same pass;
     every new best is verified as it is found (poisoned output, checked rows
     against the numpy reference), so a wrong kernel can be neither the
     yardstick that drops the others nor the winner;
  4. each pair's winners written to the DB in one locked update as soon as
     the pair is done: a crash or a timeout loses the pair in progress only.

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
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..codegen.buckets import LABELS, bucket_of, representative_M
from .timing import BUDGET_MS, DROP_RATIO, RANK_BUDGET_MS, Timer, Timing, n_copies
from .tuning_db import TuningDB, format_table, make_key, make_record, speedup

# Timing policy: see timing.py (BUDGET_MS: device time per config in the final
# pass, RANK_BUDGET_MS: in the rank pass, DROP_RATIO: drop a config this much
# slower than the best so far).
FINALISTS = 4            # rank-pass leaders timed again in full (plus the heuristic's pick)
N_RUNNER_UP = 3
MEM_CAP = 4 << 30        # most memory the rotating copies of one problem take (as opgen bench)


# --- the lead's modules (imported late) -----------------------------------------------

def _candidates(spec, arch, M, N, K):
    from opgen.codegen.planner import candidates
    return list(candidates(spec, arch, M, N, K))


def _heuristic(spec, arch, M, N, K):
    from opgen.codegen.planner import heuristic
    return heuristic(spec, arch, M, N, K)


def _stages(spec, cfg):
    """The kernels one config launches, each a (spec, config) compiled on its
    own: the config itself, or a predecode config's dequant stage and dense
    GEMM (planner.stages; Kernel launches them in turn)."""
    from opgen.codegen.planner import stages
    return stages(spec, cfg)


def _device_info(arch: Optional[str]) -> Tuple[str, str, str]:
    from .device import current_arch, device_name, nvrtc_version
    return arch or current_arch(), device_name(), nvrtc_version()


def _compile_many(jobs, workers):
    """compiler.compile_many: compiles (spec, config, arch) jobs into the cubin
    cache (where Kernel loads them from), yielding (job, None | why not) as
    each finishes; in 'spawn' worker processes when workers > 1."""
    from opgen.codegen.compiler import compile_many
    return compile_many(jobs, workers)


def _make_session(arch):
    return _Session(arch)


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
    """{bucket: record} of one (spec, N, K) as stored in the DB, plus what went
    wrong on the way."""

    def __init__(self, key, spec_name: str = "", N: int = 0, K: int = 0):
        super().__init__()
        self.key = key
        self.spec_name, self.N, self.K = spec_name, N, K
        self.error: Optional[str] = None                  # why the pair was not tuned at all
        self.compile_failed: Dict[str, str] = {}          # config name -> why
        self.launch_failed: Dict[str, str] = {}           # config name -> why
        self.verify_failed: Dict[str, List[Tuple[str, str]]] = {}  # bucket -> [(name, why)]
        self.untuned: Dict[str, str] = {}                 # bucket -> why no record
        self.seconds = 0.0                                # timing + verification
        self.finished = False                             # tuned (and stored) or given up on

    def ok(self) -> bool:
        return self.error is None and not self.untuned


@dataclass
class TuneRun:
    """What tune_many did: the results per (spec, N, K), in the order tuned."""
    results: List[TuneResults]
    plan_s: float = 0.0
    kernels: int = 0                 # unique kernels compiled (or found in the cubin cache)
    kernels_failed: int = 0
    compile_s: float = 0.0           # until the last kernel was done (the GPU times meanwhile)
    total_s: float = 0.0
    interrupted: bool = False        # stopped by Ctrl-C / SIGINT (what was stored stays)


@dataclass
class _BucketPlan:
    bucket: str
    M: int
    candidates: list
    heuristic: object


@dataclass
class _Pair:
    """One (spec, N x K) of a run: its buckets' plans and its results."""
    spec: object
    N: int
    K: int
    results: TuneResults
    buckets: List[_BucketPlan] = field(default_factory=list)


@dataclass(frozen=True)
class _Options:
    budget_ms: float
    rank_budget_ms: float
    finalists: int
    drop_ratio: float
    repeats: Optional[int]
    seed: int


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


# --- planning and compiling ------------------------------------------------------------

def _bucket_Ms(Ms) -> Dict[str, int]:
    """{bucket: the M it is tuned at} for Ms (default: every bucket at its
    representative M); a second M of the same bucket is skipped, with a warning."""
    if Ms is None:
        Ms = [representative_M(label) for label in LABELS]
    chosen: Dict[str, int] = {}
    for M in Ms:
        b = bucket_of(int(M))
        if b in chosen:
            warnings.warn(f"M={M} falls in bucket {b} like M={chosen[b]}; tuning M={chosen[b]} only")
            continue
        chosen[b] = int(M)
    return chosen


def _plan(spec, arch, N, K, Ms: Dict[str, int]) -> List[_BucketPlan]:
    plans = []
    for b, M in Ms.items():
        cands = list(dict.fromkeys(_candidates(spec, arch, M, N, K)))     # dedupe, keep order
        plans.append(_BucketPlan(b, M, cands, _heuristic(spec, arch, M, N, K)))
    return plans


def _plan_pairs(specs, shapes, Ms, arch, device, nvrtc) -> List[_Pair]:
    """Every (spec, shape), spec by spec (a spec's kernels stay loaded for all
    its shapes).  A shape the planner refuses for a spec (PlanError) is
    reported on that pair, and the others go on."""
    pairs = []
    for spec in specs:
        for N, K in shapes:
            key = make_key(spec, N, K, arch=arch, device=device, nvrtc=nvrtc)
            pair = _Pair(spec, int(N), int(K), TuneResults(key, spec.name, int(N), int(K)))
            try:
                pair.buckets = _plan(spec, arch, N, K, Ms)
            except Exception as e:
                pair.results.error = f"{type(e).__name__}: {e}"
            pairs.append(pair)
    return pairs


def _name(cfg) -> str:
    return str(getattr(cfg, "name", cfg))


def _compile_all(jobs: Sequence[Tuple[object, object]], arch, workers: int, done,
                 stop=lambda: False) -> None:
    """Compile (spec, config) jobs through _compile_many, calling done(job,
    None | why not) as each finishes; stop() true ends it early (the queued
    jobs are dropped)."""
    if workers <= 1 or len(jobs) <= 1:
        # In this process, one job at a time: an unexpected exception (a
        # compiler bug) drops that config only.  (In worker processes every
        # exception comes back as the why.)
        for spec, cfg in jobs:
            try:
                for _, why in _compile_many([(spec, cfg, arch)], 1):
                    done((spec, cfg), why)
            except Exception as e:                 # a compiler bug: drop, but say so
                done((spec, cfg), f"{type(e).__name__}: {e}")
            if stop():
                return
        return
    for (spec, cfg, _), why in _compile_many([(spec, cfg, arch) for spec, cfg in jobs], workers):
        done((spec, cfg), why)
        if stop():                     # leaving the loop closes compile_many: it drops the rest
            return


class _Compiles:
    """Every kernel of the run in one compile_many pool, all submitted at the
    start, in the order the specs are timed.  With workers > 1 a background
    thread drains the pool while the GPU times the specs whose kernels are
    done (NVRTC would otherwise leave the GPU idle for minutes); wait(spec)
    blocks until every kernel of spec's configs is done.  (The timing loop
    is Python and needs a core of its own: tune_many leaves it one.)  With
    workers = 1 everything compiles first, in this process.

    stages: {(spec, config): the (spec, config) kernels it launches}."""

    def __init__(self, stages: Dict[Tuple[object, object], list], arch, workers: int,
                 prog: _Progress):
        self.stages, self.prog = stages, prog
        self.jobs = list(dict.fromkeys(j for st in stages.values() for j in st))
        self.owners: Dict[Tuple[object, object], set] = {}
        for (spec, _), st in stages.items():
            for j in st:
                self.owners.setdefault(j, set()).add(spec)
        self.pending: Dict[object, int] = {}
        for specs in self.owners.values():
            for spec in specs:
                self.pending[spec] = self.pending.get(spec, 0) + 1
        self.status: Dict[Tuple[object, object], Optional[str]] = {}
        self.t0 = time.perf_counter()
        self.seconds: Optional[float] = None           # until the last kernel was done
        self._announced = False
        self._cond = threading.Condition()
        self._stop = False
        self._in_thread = workers > 1 and len(self.jobs) > 1
        if self._in_thread:
            threading.Thread(target=self._drain, args=(arch, workers), daemon=True,
                             name="opgen-tune-compile").start()
        else:
            _compile_all(self.jobs, arch, 1, self._done)

    def _done(self, job, why) -> None:
        with self._cond:
            self.status[job] = why
            for spec in self.owners[job]:
                self.pending[spec] -= 1
            n = len(self.status)
            if n == len(self.jobs):
                self.seconds = time.perf_counter() - self.t0
            self._cond.notify_all()
        if not self._in_thread:        # (the drain thread leaves the progress line alone)
            self.prog.show(self._progress_text(), milestone=n == len(self.jobs))

    def _drain(self, arch, workers: int) -> None:
        try:
            _compile_all(self.jobs, arch, workers, self._done, stop=lambda: self._stop)
        except Exception as e:          # the pool itself broke: what is left failed
            for job in self.jobs:
                if job not in self.status:
                    self._done(job, f"{type(e).__name__}: {e}")

    def _progress_text(self) -> str:
        n = len(self.status)
        return f"compile {self.prog.bar(n, len(self.jobs))} {n}/{len(self.jobs)}  failed {self.failed()}"

    def wait(self, spec) -> None:
        with self._cond:
            while self.pending.get(spec, 0) > 0:
                self._cond.wait(timeout=0.2)
                self.prog.show(f"{self._progress_text()}  (waiting for {spec.name})")
        self.prog.end()
        if self.seconds is not None and not self._announced:
            self._announced = True
            self.prog.log(f"compiled {len(self.jobs)} kernels in {self.seconds:.1f} s "
                          f"({self.failed()} failed)")

    def failed(self) -> int:
        return sum(why is not None for why in self.status.values())

    def verdict(self, spec, cfg) -> Optional[str]:
        """Why a kernel of (spec, cfg) did not compile, or None (also for
        kernels not done yet: after wait(spec) all of spec's are)."""
        return next((self.status[j] for j in self.stages[spec, cfg]
                     if self.status.get(j) is not None), None)

    def close(self) -> None:
        self._stop = True


# --- tuning ----------------------------------------------------------------------------

def tune(spec, N: int, K: int, Ms: Optional[Sequence[int]] = None, arch: Optional[str] = None,
         db=None, workers: Optional[int] = None, repeats: Optional[int] = None,
         progress: bool = True, **policy) -> TuneResults:
    """Tune `spec` at N, K for the buckets of `Ms`; see tune_many (policy:
    its keyword arguments)."""
    run = tune_many([spec], [(N, K)], Ms, arch=arch, db=db, workers=workers, repeats=repeats,
                    progress=progress, **policy)
    return run.results[0]


def tune_many(specs: Sequence, shapes: Sequence[Tuple[int, int]],
              Ms: Optional[Sequence[int]] = None, arch: Optional[str] = None, db=None,
              workers: Optional[int] = None, repeats: Optional[int] = None,
              progress: bool = True, *, budget_ms: float = BUDGET_MS,
              rank_budget_ms: float = RANK_BUDGET_MS, finalists: int = FINALISTS,
              drop_ratio: float = DROP_RATIO, seed: int = 0) -> TuneRun:
    """Tune every spec at every (N, K) of `shapes` for the buckets of `Ms`
    (default: every bucket at its representative M) on the current GPU; store
    each pair's winners as soon as it is done.  Ctrl-C (SIGINT) stops at the
    pair in progress and returns what was done (run.interrupted).

    db: a TuningDB, a path, or None for the default DB.  workers: compile
    processes (default: all cores but one; 1: compile everything first, in
    this process).  repeats: samples per config in the
    final pass (default: adaptive, about budget_ms of device time each).
    rank_budget_ms: device time per candidate in the rank pass.  finalists:
    how many of the rank pass's fastest are timed again (with the
    heuristic's pick).
    """
    t0 = time.perf_counter()
    opts = _Options(float(budget_ms), float(rank_budget_ms), int(finalists), float(drop_ratio),
                    repeats, int(seed))
    arch, device, nvrtc = _device_info(arch)
    if not isinstance(db, TuningDB):
        db = TuningDB(db)
    prog = _Progress(progress)

    pairs = _plan_pairs(specs, shapes, _bucket_Ms(Ms), arch, device, nvrtc)
    stages = {sc: list(_stages(*sc)) for sc in dict.fromkeys(
        (p.spec, c) for p in pairs for b in p.buckets for c in (b.heuristic, *b.candidates))}
    run = TuneRun([p.results for p in pairs], plan_s=time.perf_counter() - t0)
    # (all cores but the one the timing loop needs)
    compiles = _Compiles(stages, arch, workers or max(1, (os.cpu_count() or 1) - 1), prog)
    run.kernels = len(compiles.jobs)
    try:
        session = _make_session(arch)
        try:
            for i, pair in enumerate(pairs):
                compiles.wait(pair.spec)
                if pair.results.error is None:
                    _tune_pair(session, pair, _compiled(pair, compiles), db, prog, opts,
                               tag=f"{i + 1}/{len(pairs)}")
                if i + 1 == len(pairs) or pairs[i + 1].spec != pair.spec:
                    session.forget(pair.spec)      # its kernels and their workspaces
        finally:
            session.close()
    except KeyboardInterrupt:        # e.g. `timeout -s INT`: report what was stored
        run.interrupted = True
        prog.end()
        for res in run.results:
            if res.error is None and not res.finished:
                res.clear()
                res.untuned.clear()
                res.error = "interrupted before it was stored"
    finally:
        compiles.close()
    run.kernels_failed, run.compile_s = compiles.failed(), compiles.seconds or 0.0
    _note_compile_failures(compiles, prog)
    for res in run.results:
        for b, why in res.untuned.items():
            warnings.warn(f"{res.spec_name} {res.N}x{res.K} bucket {b}: no config stored ({why})")
    run.total_s = time.perf_counter() - t0
    return run


def _compiled(pair: _Pair, compiles: _Compiles) -> set:
    """The (spec, config)s of pair that compiled; the others go to its
    results' compile_failed."""
    ok = set()
    for c in dict.fromkeys(c for b in pair.buckets for c in (b.heuristic, *b.candidates)):
        why = compiles.verdict(pair.spec, c)
        if why is None:
            ok.add((pair.spec, c))
        else:
            pair.results.compile_failed[_name(c)] = why
    return ok


def _note_compile_failures(compiles: _Compiles, prog: _Progress) -> None:
    failed = {(s.name, _name(c)): w for (s, c) in compiles.stages
              if (w := compiles.verdict(s, c)) is not None}
    if failed:
        prog.log(f"{compiles.failed()} of {len(compiles.jobs)} kernels did not compile "
                 f"(e.g. {next(iter(failed.items()))})")
    odd = {k: w for k, w in failed.items() if not w.startswith(("CompileError", "PlanError"))}
    if odd:
        warnings.warn(f"{len(odd)} config(s) failed to compile with an unexpected error, "
                      f"e.g. {next(iter(odd.items()))}")


def _tune_pair(session, pair: _Pair, compiled, db, prog: _Progress, opts: _Options,
               tag: str) -> None:
    res, t0 = pair.results, time.perf_counter()
    try:
        bench = session.bench(pair.spec, pair.N, pair.K, opts.seed)
    except Exception as e:                       # e.g. out of memory: this pair only
        res.error = f"setup failed: {type(e).__name__}: {e}"
        res.finished = True
        prog.log(f"{tag} {pair.spec.name} {pair.N}x{pair.K}: {res.error}")
        return
    try:
        for plan in pair.buckets:
            try:
                rec = _tune_bucket(bench, pair, plan, compiled, prog, opts, tag)
            except Exception as e:               # e.g. out of memory at a large M
                res.untuned[plan.bucket] = f"{type(e).__name__}: {e}"
                continue
            if rec is not None:
                res[plan.bucket] = rec
    finally:
        bench.close()
    if res:
        db.put_many((res.key, b, rec) for b, rec in res.items())
    res.finished = True
    res.seconds = time.perf_counter() - t0
    prog.log(f"{tag} {pair.spec.name} {pair.N}x{pair.K}: stored {len(res)} of "
             f"{len(pair.buckets)} bucket(s) in {res.seconds:.1f} s")


class _Verdicts:
    """Verification results of one bucket: each config checked at most once."""

    def __init__(self, bench, tol: float):
        self.bench, self.tol = bench, tol
        self.seen: Dict[object, Tuple[bool, float]] = {}
        self.rejected: List[Tuple[str, str]] = []

    def ok(self, cfg) -> bool:
        if cfg not in self.seen:
            ok, err, why = self.bench.verify(cfg, self.tol)
            self.seen[cfg] = (ok, err)
            if not ok:
                self.rejected.append((_name(cfg), why))
        return self.seen[cfg][0]

    def failed(self, cfg) -> bool:
        return cfg in self.seen and not self.seen[cfg][0]


def _tune_bucket(bench, pair: _Pair, plan: _BucketPlan, compiled, prog: _Progress,
                 opts: _Options, tag: str) -> Optional[dict]:
    spec, res, heur = pair.spec, pair.results, plan.heuristic
    order = [c for c in dict.fromkeys([heur, *plan.candidates]) if (spec, c) in compiled]
    if not order:
        res.untuned[plan.bucket] = "no candidate compiled"
        return None
    bench.select(plan.M)
    verdicts = _Verdicts(bench, tolerance(spec))
    what = f"tune {tag} {spec.name} {pair.N}x{pair.K} [{plan.bucket} M={plan.M}]"
    quick = _rank_pass(bench, order, heur, verdicts, res, prog, what, opts)
    final = _final_pass(bench, _finalists(quick, heur, verdicts, opts.finalists), quick, res,
                        prog, what, opts)
    # The fastest correct finalist; each is verified only when it is the
    # fastest left (most were verified in the rank pass as a new best).
    best = next((c for c in sorted(final, key=lambda c: final[c].median_us) if verdicts.ok(c)),
                None)
    if verdicts.rejected:
        res.verify_failed[plan.bucket] = verdicts.rejected
        prog.log(f"{spec.name} {pair.N}x{pair.K} bucket {plan.bucket}: "
                 f"{len(verdicts.rejected)} config(s) failed verification "
                 f"(tolerance {verdicts.tol:.1e}): "
                 + "; ".join(f"{n}: {w}" for n, w in verdicts.rejected))
    if best is None:
        res.untuned[plan.bucket] = ("no candidate could be launched" if not quick else
                                    "every candidate timed failed verification")
        return None
    heur_us = final[heur].median_us if heur in final else None
    prog.show(f"{what} {len(quick)} ranked, {len(final)} in full: {final[best].median_us:.2f} us "
              f"({_name(best)})" + (f", heuristic {heur_us:.2f} us" if heur_us else ""),
              milestone=True)
    prog.end()
    runner_up = sorted(t.median_us for c, t in final.items()
                       if c != best and not verdicts.failed(c))[:N_RUNNER_UP]
    extra = {"rel_err": float(f"{verdicts.seen[best][1]:.3g}"), "ranked": len(quick)}
    if verdicts.rejected:
        extra["rejected"] = [n for n, _ in verdicts.rejected]
    return make_record(best.to_dict(), final[best].median_us, M=plan.M, runner_up_us=runner_up,
                       heuristic_us=heur_us, config_name=_name(best), **extra)


def _rank_pass(bench, order, heur, verdicts: _Verdicts, res: TuneResults, prog: _Progress,
               what: str, opts: _Options) -> Dict[object, Timing]:
    """{config: its rank-pass timing} of every candidate that launched."""
    quick: Dict[object, Timing] = {}
    best = None
    for i, cfg in enumerate(order, 1):
        try:
            # The heuristic's pick comes first and is never dropped: it is a
            # finalist whatever the others do.
            t = bench.rank(cfg, best_us=None if cfg == heur or best is None
                           else quick[best].median_us,
                           budget_ms=opts.rank_budget_ms, drop_ratio=opts.drop_ratio)
        except Exception as e:
            res.launch_failed[_name(cfg)] = f"{type(e).__name__}: {e}"
            continue
        quick[cfg] = t
        if not t.dropped and (best is None or t.median_us < quick[best].median_us):
            # Verify every new best at once, not only the final winner: a wrong
            # kernel (say one that skips work) would otherwise be the yardstick
            # that gets correct configs dropped early.  Rejecting it here makes
            # the next fastest correct config the best.
            if verdicts.ok(cfg):
                best = cfg
        best_txt = f"best {quick[best].median_us:.2f} us ({_name(best)})" if best is not None else ""
        prog.show(f"{what} rank {prog.bar(i, len(order))} {i}/{len(order)}  {best_txt}")
    return quick


def _finalists(quick: Dict[object, Timing], heur, verdicts: _Verdicts, n: int) -> list:
    """The heuristic's pick (whenever it launched: its full-budget time is the
    baseline the winner is held to) and the n fastest of the rank pass that
    were not dropped and are not known to be wrong."""
    ranked = sorted((c for c, t in quick.items() if not t.dropped and not verdicts.failed(c)),
                    key=lambda c: quick[c].median_us)
    return list(dict.fromkeys(([heur] if heur in quick else []) + ranked[:n]))


def _final_pass(bench, finalists, quick, res: TuneResults, prog: _Progress, what: str,
                opts: _Options) -> Dict[object, Timing]:
    """{config: its full-budget timing}: every finalist in full, none dropped."""
    final: Dict[object, Timing] = {}
    for i, cfg in enumerate(finalists, 1):
        try:
            final[cfg] = bench.time(cfg, estimate_us=quick[cfg].median_us,
                                    budget_ms=opts.budget_ms, repeats=opts.repeats)
        except Exception as e:
            res.launch_failed[_name(cfg)] = f"{type(e).__name__}: {e}"
        prog.show(f"{what} final {prog.bar(i, len(finalists))} {i}/{len(finalists)}")
    return final


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



def _nonfinite(spec, out, xp) -> int:
    """How many elements of an output are NaN/Inf (bfloat16: by its bits)."""
    if spec.out.dtype == "bfloat16":
        return int(((out & 0x7F80) == 0x7F80).sum())
    return int((~xp.isfinite(out)).sum())


@dataclass(frozen=True)
class _BaseWeights:
    """The random weights of a spec at a base shape N0 x K0 (host), their bias
    and their dequantized real values (for the check)."""
    tensors: dict
    bias: Optional[np.ndarray]
    real: np.ndarray


@functools.lru_cache(maxsize=2)
def _base_weights(spec, N0: int, K0: int, seed: int) -> _BaseWeights:
    """Drawn once per spec and base shape (the bench shapes all share 2048 x
    2048), so every shape and bucket of a spec reuses them."""
    from opgen.bench.verify import _reference_weight
    from opgen.codegen.reference import random_bias, random_weight_tensors
    rng = np.random.default_rng([seed, N0, K0])
    tensors = dict(random_weight_tensors(spec, N0, K0, rng))
    bias = random_bias(spec, N0, rng) if spec.epilogue.bias else None
    return _BaseWeights(tensors, bias, _reference_weight(spec, tensors, N0, K0))


@functools.lru_cache(maxsize=16)
def _base_activation(spec, M0: int, K0: int, seed: int):
    """(a, a_scale or None) at M0 x K0, N(0, 1) values in spec.a's storage."""
    from opgen.codegen.reference import random_activation
    return random_activation(spec, M0, K0, np.random.default_rng([seed, 1, M0, K0]))


class _Session:
    """The run's GPU side: cupy, one Timer (one stream, one CUDA context) and
    the loaded kernels of the spec being tuned, shared by its shapes and
    buckets.  _Bench reaches the device only through it (tests put numpy in
    its place)."""

    base_limit = None            # verify.base_shape's limit (None: its default)

    def __init__(self, arch):
        import cupy
        self.xp, self.arch = cupy, arch
        self.timer = Timer()
        self.stream = self.timer.stream
        self.kernels: dict = {}
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        self.l2 = int(props.get("l2CacheSize", 0)) or (60 << 20)

    def to_device(self, x):
        return _to_device(x)

    def to_host(self, x) -> np.ndarray:
        return self.xp.asnumpy(x)

    def free_bytes(self) -> int:
        return int(self.xp.cuda.runtime.memGetInfo()[0])

    def synchronize(self) -> None:
        self.xp.cuda.Device().synchronize()

    def release(self) -> None:
        self.xp.get_default_memory_pool().free_all_blocks()

    def kernel(self, spec, cfg):
        k = self.kernels.get((spec, cfg))
        if k is None:
            from opgen.runtime.kernel import Kernel
            k = self.kernels[spec, cfg] = Kernel(spec, cfg, self.arch)
        return k

    def bench(self, spec, N: int, K: int, seed: int) -> "_Bench":
        return _Bench(self, spec, N, K, seed)

    def forget(self, spec) -> None:
        """Unload spec's kernels, and with them their split-K workspaces."""
        for key in [k for k in self.kernels if k[0] == spec]:
            del self.kernels[key]
        self.release()

    def close(self) -> None:
        self.kernels.clear()
        self.release()


class _Bench:
    """One (spec, N, K) on the GPU: the tiled random problem, timing and
    verification, bucket by bucket (select(M) first).

    The random data are drawn in numpy at a small base shape (weights N0 x K0
    dividing N x K, verify.base_shape; activations M0 rows, verify.base_rows)
    and tiled up on the GPU: the kernels' speed does not depend on the values,
    and the reference of a checked row costs a base-shape row, not N * K.
    Launch i uses the i % n-th of n rotating copies of every input and output
    (timing.n_copies: together over twice the L2), so a small problem does
    not find its data in L2; the weight copies are kept for all buckets."""

    def __init__(self, session, spec, N: int, K: int, seed: int = 0, mem_cap: int = MEM_CAP):
        from opgen.bench.roofline import stored_shapes
        from opgen.bench.verify import base_shape, tile_to
        self.session, self.xp = session, session.xp
        self.spec, self.N, self.K, self.seed, self.mem_cap = spec, N, K, seed, mem_cap
        limit = {} if session.base_limit is None else {"limit": session.base_limit}
        self.N0, self.K0 = base_shape(spec, N, K, **limit)
        self.base = _base_weights(spec, self.N0, self.K0, seed)
        want = stored_shapes(spec, N, K)
        self.w_sets = [{k: tile_to(session.to_device(v), want[k], self.xp)
                        for k, v in self.base.tensors.items()}]
        self.bias = (None if self.base.bias is None else
                     tile_to(session.to_device(self.base.bias), (N,), self.xp))
        self.M = None
        self.acts = self.outs = self.check_out = None

    def select(self, M: int) -> None:
        """Make bucket M's buffers: the activation drawn at M0 x K0 and tiled
        to M x K, and enough rotating copies of every input and output."""
        from opgen.bench.verify import base_rows, tile_to
        xp, dev = self.xp, self.session
        self.acts = self.outs = self.check_out = None           # the last bucket's, freed first
        self.M, self.M0 = M, base_rows(M)
        self.a_host, self.s_host = _base_activation(self.spec, self.M0, self.K0, self.seed)
        a = tile_to(dev.to_device(self.a_host), (M, self.K), xp)
        s = None if self.s_host is None else tile_to(dev.to_device(self.s_host), (M,), xp)
        out_dt = _out_dtype(self.spec)
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

    def _launcher(self, cfg):
        kernel = self.session.kernel(self.spec, cfg)
        acts, outs, w_sets, bias = self.acts, self.outs, self.w_sets, self.bias
        n, stream = len(acts), self.session.stream

        def launch(i):
            a, a_scale = acts[i % n]
            kernel(a, w_sets[i % n], outs[i % n], a_scale=a_scale, bias=bias, stream=stream)
        return launch

    def rank(self, cfg, best_us=None, *, budget_ms: float, drop_ratio: float) -> Timing:
        return self.session.timer.rank(self._launcher(cfg), best_us, budget_us=budget_ms * 1e3,
                                       drop_ratio=drop_ratio)

    def time(self, cfg, *, estimate_us=None, budget_ms: float, repeats=None) -> Timing:
        return self.session.timer.measure(self._launcher(cfg), None, budget_us=budget_ms * 1e3,
                                          repeats=repeats, estimate_us=estimate_us)

    def verify(self, cfg, tol: float) -> Tuple[bool, float, str]:
        """(ok, relative error, why not) of cfg on the first input set: the
        output is poisoned with NaN first and must come back finite everywhere
        (every element written), and its checked rows (verify.check_rows_of:
        the first, middle and last m-tiles) must match the reference within
        tol (verify.check_rows)."""
        from opgen.bench.verify import check_rows, check_rows_of
        xp, dev, spec, out = self.xp, self.session, self.spec, self.check_out
        a, a_scale = self.acts[0]
        rows = check_rows_of(self.M)
        try:
            with dev.stream:
                out.fill(_poison(spec))
                dev.kernel(spec, cfg)(a, self.w_sets[0], out, a_scale=a_scale, bias=self.bias,
                                      stream=dev.stream)
                bad = _nonfinite(spec, out, xp)
                got = _out_to_f32(spec, dev.to_host(out[xp.asarray(rows)]))
        except Exception as e:
            return False, math.inf, f"launch failed: {type(e).__name__}: {e}"
        if bad:
            return False, math.inf, f"{bad} of {out.size} outputs NaN/Inf (unwritten or overflowed)"
        base = rows % self.M0
        r = check_rows(spec, self.a_host[base], None if self.s_host is None else self.s_host[base],
                       self.base.real, self.base.bias, got, self.N, self.K, self.N0, self.K0,
                       tol=tol)
        err = math.inf if r["rel_err"] is None else r["rel_err"]
        return r["verified"], err, r.get("verify_msg", "")


# --- `opgen tune` ------------------------------------------------------------------------

def _positive_float(text: str) -> float:
    import argparse
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return v


def add_cli(subparsers) -> None:
    """Add `opgen tune SPEC... | --all  --shapes NxK,... | --N --K  [--M 1,16,64]`;
    sets args.func."""
    from opgen.bench.plan import parse_ints, parse_shapes
    from opgen.cli import positive_int
    p = subparsers.add_parser(
        "tune", help="tune tile configs on this GPU and store the winners",
        description="Time the planner's candidate configs of every spec at every shape and M "
                    "bucket on this GPU (all of them on a short budget, then the fastest few "
                    "and the heuristic's pick in full), verify them, and store the fastest "
                    "correct one per bucket in the tuning DB.")
    p.add_argument("spec", nargs="*", metavar="SPEC", help="spec names or YAML files")
    p.add_argument("--all", action="store_true", help="every shipped matmul spec")
    p.add_argument("--shapes", type=parse_shapes, default=None, metavar="NxK,...",
                   help="weight shapes N x K, e.g. 4096x4096,8192x8192")
    p.add_argument("--N", type=positive_int, default=None, help="with --K: one shape")
    p.add_argument("--K", type=positive_int, default=None)
    p.add_argument("--M", type=parse_ints, default=None, metavar="M,...",
                   help="comma-separated M values, one per bucket "
                        "(default: every bucket at its representative M)")
    p.add_argument("--db", help="tuning DB file (default: $OPGEN_TUNING_DB or ~/.cache/opgen/tuning.json)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="compile processes (default: all cores but one; 1: compile everything "
                        "first, in this process)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="samples per config in the final pass (default: adaptive)")
    p.add_argument("--budget-ms", type=_positive_float, default=BUDGET_MS,
                   help=f"device time per config in the final pass (default {BUDGET_MS:g})")
    p.add_argument("--rank-budget-ms", type=_positive_float, default=RANK_BUDGET_MS,
                   help=f"device time per candidate in the rank pass (default {RANK_BUDGET_MS:g})")
    p.add_argument("--finalists", type=positive_int, default=FINALISTS,
                   help="rank-pass leaders timed again in full, with the heuristic's pick "
                        f"(default {FINALISTS})")
    p.add_argument("--seed", type=int, default=0, help="of the random problems")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=_cli_tune)


def _cli_specs_and_shapes(args):
    """(specs, shapes) of the command line; a UserError names the argument at fault."""
    from opgen.bench.plan import _load_specs, shipped_matmul_specs
    from opgen.codegen import planner
    from opgen.codegen.errors import UserError
    if args.all and args.spec:
        raise UserError("give SPEC names or --all, not both")
    if not args.all and not args.spec:
        raise UserError("no spec: give SPEC names (or --all for every shipped matmul spec)")
    if args.shapes and (args.N is not None or args.K is not None):
        raise UserError("--shapes and --N/--K both given: use one")
    if (args.N is None) != (args.K is None):
        raise UserError("--N and --K go together (or give --shapes NxK)")
    shapes = args.shapes or ([(args.N, args.K)] if args.N is not None else None)
    if not shapes:
        raise UserError("no shape: give --shapes NxK[,NxK...] (or --N and --K)")
    names = shipped_matmul_specs() if args.all else list(dict.fromkeys(args.spec))
    specs = _load_specs(names, command="opgen tune")
    for spec in specs:
        for N, K in shapes:
            try:
                planner.check_shape(spec, N, K)
            except planner.PlanError as e:
                raise UserError(f"{spec.name} at N={N}, K={K} (--shapes/--N/--K): {e}") from None
    return specs, shapes


def _cli_tune(args) -> int:
    specs, shapes = _cli_specs_and_shapes(args)
    run = tune_many(specs, shapes, Ms=args.M, db=args.db, workers=args.workers,
                    repeats=args.repeats, progress=not args.quiet, budget_ms=args.budget_ms,
                    rank_budget_ms=args.rank_budget_ms, finalists=args.finalists, seed=args.seed)
    print(report(run, args.db or TuningDB().path))
    if run.interrupted:
        return 130                   # as a shell reports SIGINT
    return 0 if all(r.ok() for r in run.results) else 1


def report(run: TuneRun, db_path) -> str:
    """A table per (spec, shape), what failed, and where the time went."""
    out: List[str] = []
    for res in run.results:
        head = f"== {res.spec_name}  N={res.N} K={res.K}"
        if res.error is not None:
            out += [f"{head}: NOT tuned ({res.error})", ""]
            continue
        rows = [[b, r["M"], r.get("config_name", ""), r["median_us"], r.get("heuristic_us"),
                 speedup(r)] for b, r in res.items()]
        out.append(f"{head}  ({res.seconds:.1f} s)")
        if rows:
            out.append(format_table(["bucket", "M", "best config", "us", "heuristic us",
                                     "speedup"], rows))
            out.append(f"stored {len(res)} record(s) under {res.key}")
        for b, why in res.untuned.items():
            out.append(f"bucket {b}: NOT tuned ({why})")
        if res.launch_failed:
            out.append(f"{len(res.launch_failed)} config(s) failed to launch: "
                       + "; ".join(f"{n}: {w}" for n, w in list(res.launch_failed.items())[:3]))
        if res.compile_failed:
            out.append(f"{len(res.compile_failed)} config(s) did not compile")
        out.append("")
    stored = sum(len(r) for r in run.results)
    wanted = sum(len(r) + len(r.untuned) for r in run.results if r.error is None)
    timing_s = sum(r.seconds for r in run.results)
    out.append(f"stored {stored} record(s) of {wanted} bucket(s), {len(run.results)} "
               f"(spec, shape) pair(s), in {db_path}")
    out.append(f"total {run.total_s:.1f} s: planning {run.plan_s:.1f} s, compiling {run.kernels} "
               f"kernels {run.compile_s:.1f} s ({run.kernels_failed} failed), timing + "
               f"verification {timing_s:.1f} s (the GPU times while the later specs compile)")
    return "\n".join(out)

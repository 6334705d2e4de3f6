"""The empirical tuner: time the planner's candidate tile configs on the GPU,
keep the fastest one that computes the right answer, store it in the tuning DB.

One run tunes any number of (spec, N x K) pairs, each for a set of M buckets
(codegen/buckets.py), in one process with one CUDA context:
  1. the planner's candidates and its heuristic pick for every bucket of
     every pair;
  2. every unique kernel of the whole run (the (spec, config) launch stages,
     planner.stages) submitted at once to one compile pool (compile_pool.py),
     in the order the specs are timed: the GPU times a spec as soon as its
     kernels are done, while the later ones compile; configs that raise
     CompileError or PlanError (e.g. too many registers or too much shared
     memory) are dropped and counted;
  3. per pair, one random problem on the GPU (workbench.Problem: drawn in
     numpy at a small base shape and tiled up, so no host work scales with
     N * K); per bucket, in two passes (see timing.Timer for how each number
     is kept honest):
       rank:  every compiled candidate, the heuristic's pick first, on a short
              budget (Timer.rank); one clearly slower than the best so far
              is dropped after its first sample;
       final: the heuristic's pick and the `finalists` fastest of the rank
              pass, again on the full budget (Timer.measure); the winner is
              the fastest correct one of these, so it is never slower than
              the heuristic's pick as measured in the same pass;
     every new best is verified as it is found (poisoned output, checked rows
     against the numpy reference, within codegen.tolerance), so a wrong
     kernel can be neither the yardstick that drops the others nor the
     winner;
  4. each pair's winners written to the DB in one locked update as soon as
     the pair is done: a crash or a timeout loses the pair in progress only;
     each record keeps its config's source hash (tuning_db.rendered_hash), so
     it is served only while the config renders to the kernel measured.

The planner, device and GPU session are reached through the small wrappers
below (_candidates, _heuristic, _stages, _device_info, _make_session), which
tests replace.  `opgen tune` (opgen/cli/tune.py) is the command line.
"""
from __future__ import annotations

import hashlib
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..codegen import planner
from ..codegen.buckets import LABELS, bucket_of, representative_M
from ..codegen.tolerance import tolerance
from . import device, tuning_db, workbench
from .compile_pool import Compiles
from .progress import Progress
from .timing import BUDGET_MS, DROP_RATIO, RANK_BUDGET_MS, Timing
from .tuning_db import TuningDB, make_key, make_record

# Timing policy: see timing.py (BUDGET_MS: device time per config in the final
# pass, RANK_BUDGET_MS: in the rank pass, DROP_RATIO: drop a config this much
# slower than the best so far).
FINALISTS = 4            # rank-pass leaders timed again in full (plus the heuristic's pick)
N_RUNNER_UP = 3


# --- what the tuner asks of the planner, the device and the GPU ------------------------

def _candidates(spec, arch, M, N, K):
    return list(planner.candidates(spec, arch, M, N, K, sms=device.planning_sms()))


def _heuristic(spec, arch, M, N, K):
    return planner.heuristic(spec, arch, M, N, K, sms=device.planning_sms())


def _stages(spec, cfg):
    """The kernels one config launches, each a (spec, config) compiled on its
    own: the config itself, or a predecode config's dequant stage and dense
    GEMM (planner.stages; Kernel launches them in turn)."""
    return planner.stages(spec, cfg)


def _device_info(arch: Optional[str]) -> Tuple[str, str, str]:
    return arch or device.current_arch(), device.device_name(), device.nvrtc_version()


def _make_session(arch):
    return workbench.Session(arch)


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
    nvrtc: str = ""                  # the NVRTC the records are measured with
    buckets: List[_BucketPlan] = field(default_factory=list)


@dataclass(frozen=True)
class _Options:
    budget_ms: float
    rank_budget_ms: float
    finalists: int
    drop_ratio: float
    repeats: Optional[int]
    seed: int


# --- planning --------------------------------------------------------------------------

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


def _plan_pairs(specs, shapes, Ms, arch, device_name, nvrtc) -> List[_Pair]:
    """Every (spec, shape), spec by spec (a spec's kernels stay loaded for all
    its shapes).  What is tuned is the spec the op runs there, its execution
    spec (planner.execution).  A shape the planner refuses for a spec
    (PlanError) is reported on that pair, and the others go on."""
    pairs = []
    for given in specs:
        for N, K in shapes:
            spec = planner.execution_spec(given, arch)
            key = make_key(spec, N, K, arch=arch, device=device_name)
            pair = _Pair(spec, int(N), int(K), TuneResults(key, spec.name, int(N), int(K)), nvrtc)
            try:
                pair.buckets = _plan(spec, arch, N, K, Ms)
            except Exception as e:
                pair.results.error = f"{type(e).__name__}: {e}"
            pairs.append(pair)
    return pairs


def _name(cfg) -> str:
    return str(getattr(cfg, "name", cfg))


def candidates_digest(cands) -> str:
    """The fingerprint of the configs a bucket was tuned among (their names,
    in any order): its record's winner is the best of those only."""
    return hashlib.sha256("\n".join(sorted(_name(c) for c in cands)).encode()).hexdigest()[:16]


def tuned_among_current(spec, arch: str, N: int, K: int, record) -> bool:
    """Whether record was tuned among the candidates the planner offers for
    its M today: a planner that offers others since (new kernels, new tiles)
    makes it worth tuning again (tune_pool.plan_tasks). A record without the
    fingerprint (tuned before it was kept) was not."""
    try:
        return record.get("candidates") == candidates_digest(_candidates(spec, arch, record["M"], N, K))
    except Exception:                # a spec or M the planner refuses now
        return False


def heuristic_unchanged(spec, arch: str, N: int, K: int, record) -> Optional[bool]:
    """Whether record's heuristic_us timed the pick the heuristic makes today
    (its "heuristic_config"); None where the record does not say (tuned
    before records kept it)."""
    name = record.get("heuristic_config")
    if name is None:
        return None
    try:
        return _name(_heuristic(spec, arch, record["M"], N, K)) == name
    except Exception:                # a spec or M the planner refuses now
        return False


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
    arch, device_name, nvrtc = _device_info(arch)
    if not isinstance(db, TuningDB):
        db = TuningDB(db)
    prog = Progress(progress)

    pairs = _plan_pairs(specs, shapes, _bucket_Ms(Ms), arch, device_name, nvrtc)
    stages = {sc: list(_stages(*sc)) for sc in dict.fromkeys(
        (p.spec, c) for p in pairs for b in p.buckets for c in (b.heuristic, *b.candidates))}
    run = TuneRun([p.results for p in pairs], plan_s=time.perf_counter() - t0)
    # (all cores but the one the timing loop needs)
    compiles = Compiles(stages, arch, workers or max(1, (os.cpu_count() or 1) - 1), prog)
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


def _compiled(pair: _Pair, compiles: Compiles) -> set:
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


def _note_compile_failures(compiles: Compiles, prog: Progress) -> None:
    failed = {(s.name, _name(c)): w for (s, c) in compiles.stages
              if (w := compiles.verdict(s, c)) is not None}
    if failed:
        prog.log(f"{compiles.failed()} of {len(compiles.jobs)} kernels did not compile "
                 f"(e.g. {next(iter(failed.items()))})")
    odd = {k: w for k, w in failed.items() if not w.startswith(("CompileError", "PlanError"))}
    if odd:
        warnings.warn(f"{len(odd)} config(s) failed to compile with an unexpected error, "
                      f"e.g. {next(iter(odd.items()))}")


def _tune_pair(session, pair: _Pair, compiled, db, prog: Progress, opts: _Options,
               tag: str) -> None:
    res, t0 = pair.results, time.perf_counter()
    try:
        trials = _Trials(session, session.problem(pair.spec, pair.N, pair.K, opts.seed), pair.spec)
    except Exception as e:                       # e.g. out of memory: this pair only
        res.error = f"setup failed: {type(e).__name__}: {e}"
        res.finished = True
        prog.log(f"{tag} {pair.spec.name} {pair.N}x{pair.K}: {res.error}")
        return
    try:
        for plan in pair.buckets:
            try:
                rec = _tune_bucket(trials, pair, plan, compiled, prog, opts, tag)
            except Exception as e:               # e.g. out of memory at a large M
                res.untuned[plan.bucket] = f"{type(e).__name__}: {e}"
                continue
            if rec is None:
                continue
            # What lookups will check the record against: the winner's kernels
            # as rendered now, from the config dict the record keeps.
            source_hash = tuning_db.rendered_hash(res.key, rec["config"])
            if source_hash is None:
                res.untuned[plan.bucket] = f"{rec['config_name']} does not render from its record"
                continue
            res[plan.bucket] = dict(rec, source_hash=source_hash, nvrtc=pair.nvrtc)
    finally:
        trials.close()
    if res:
        db.put_many((res.key, b, rec) for b, rec in res.items())
    res.finished = True
    res.seconds = time.perf_counter() - t0
    prog.log(f"{tag} {pair.spec.name} {pair.N}x{pair.K}: stored {len(res)} of "
             f"{len(pair.buckets)} bucket(s) in {res.seconds:.1f} s")


class _Trials:
    """A pair's problem (workbench.Problem) asked about configs: each config's
    kernel is loaded once (session.kernel) and kept for every shape and
    bucket of its spec."""

    def __init__(self, session, problem, spec):
        self.session, self.problem, self.spec = session, problem, spec

    def select(self, M: int) -> None:
        self.problem.select(M)

    def rank(self, cfg, best_us=None, *, budget_ms: float, drop_ratio: float) -> Timing:
        return self.problem.rank(self.session.kernel(self.spec, cfg), best_us,
                                 budget_ms=budget_ms, drop_ratio=drop_ratio)

    def time(self, cfg, *, estimate_us=None, budget_ms: float, repeats=None) -> Timing:
        return self.problem.time(self.session.kernel(self.spec, cfg), estimate_us=estimate_us,
                                 budget_ms=budget_ms, repeats=repeats)

    def verify(self, cfg, tol: float) -> Tuple[bool, float, str]:
        try:
            kernel = self.session.kernel(self.spec, cfg)
        except Exception as e:
            return False, math.inf, f"launch failed: {type(e).__name__}: {e}"
        return self.problem.verify(kernel, tol)

    def close(self) -> None:
        self.problem.close()


class _Verdicts:
    """Verification results of one bucket: each config checked at most once."""

    def __init__(self, trials: _Trials, tol: float):
        self.trials, self.tol = trials, tol
        self.seen: Dict[object, Tuple[bool, float]] = {}
        self.rejected: List[Tuple[str, str]] = []

    def ok(self, cfg) -> bool:
        if cfg not in self.seen:
            ok, err, why = self.trials.verify(cfg, self.tol)
            self.seen[cfg] = (ok, err)
            if not ok:
                self.rejected.append((_name(cfg), why))
        return self.seen[cfg][0]

    def failed(self, cfg) -> bool:
        return cfg in self.seen and not self.seen[cfg][0]


def _tune_bucket(trials: _Trials, pair: _Pair, plan: _BucketPlan, compiled, prog: Progress,
                 opts: _Options, tag: str) -> Optional[dict]:
    spec, res, heur = pair.spec, pair.results, plan.heuristic
    order = [c for c in dict.fromkeys([heur, *plan.candidates]) if (spec, c) in compiled]
    if not order:
        res.untuned[plan.bucket] = "no candidate compiled"
        return None
    trials.select(plan.M)
    verdicts = _Verdicts(trials, tolerance(spec))
    what = f"tune {tag} {spec.name} {pair.N}x{pair.K} [{plan.bucket} M={plan.M}]"
    quick = _rank_pass(trials, order, heur, verdicts, res, prog, what, opts)
    final = _final_pass(trials, _finalists(quick, heur, verdicts, opts.finalists), quick, res,
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
    # heuristic_config: the pick heuristic_us timed (the heuristic changes;
    # a record then says whether its figure is still the pick's).
    extra = {"rel_err": float(f"{verdicts.seen[best][1]:.3g}"), "ranked": len(quick),
             "candidates": candidates_digest(plan.candidates), "heuristic_config": _name(heur)}
    if verdicts.rejected:
        extra["rejected"] = [n for n, _ in verdicts.rejected]
    return make_record(best.to_dict(), final[best].median_us, M=plan.M, runner_up_us=runner_up,
                       heuristic_us=heur_us, config_name=_name(best), **extra)


def _rank_pass(trials: _Trials, order, heur, verdicts: _Verdicts, res: TuneResults, prog: Progress,
               what: str, opts: _Options) -> Dict[object, Timing]:
    """{config: its rank-pass timing} of every candidate that launched."""
    quick: Dict[object, Timing] = {}
    best = None
    for i, cfg in enumerate(order, 1):
        try:
            # The heuristic's pick comes first and is never dropped: it is a
            # finalist whatever the others do.
            t = trials.rank(cfg, best_us=None if cfg == heur or best is None
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


def _final_pass(trials: _Trials, finalists, quick, res: TuneResults, prog: Progress, what: str,
                opts: _Options) -> Dict[object, Timing]:
    """{config: its full-budget timing}: every finalist in full, none dropped."""
    final: Dict[object, Timing] = {}
    for i, cfg in enumerate(finalists, 1):
        try:
            final[cfg] = trials.time(cfg, estimate_us=quick[cfg].median_us,
                                    budget_ms=opts.budget_ms, repeats=opts.repeats)
        except Exception as e:
            res.launch_failed[_name(cfg)] = f"{type(e).__name__}: {e}"
        prog.show(f"{what} final {prog.bar(i, len(finalists))} {i}/{len(finalists)}")
    return final

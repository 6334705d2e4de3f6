"""Tuning many (spec, N, K) pairs on several GPUs at once.

Each pair is a Task that one worker tunes end to end on its own GPU
(tune_task: tuner.tune_many of that pair, its kernels compiled in the
worker's own compile pool).  The winners come back to this process, the
driver, which stores them with the DB's locked, merged writes as each pair
finishes, under the key of the device that measured them (a record from
another GPU type lands under that type).  A backend runs the tasks:
LocalWorkers here (spawned processes, one per GPU), tune_ray.RayWorkers on a
Ray cluster.  Either way:
  * a worker that dies loses only the pair it was tuning (reported failed,
    with its exit code); the others go on, and a local GPU gets a fresh
    worker (at most RESTARTS times);
  * a rerun resumes: a pair whose every requested M bucket the user DB
    already serves for a worker's (arch, device) is skipped by that worker
    (Task.done_on), unless force;
  * one status line follows all workers (pairs done / total, what each
    worker is on), one log line per pair; PoolRun.devices() tallies the run
    per device.
`opgen tune --ray / --gpus` (opgen/cli/tune.py) is the command line; with
one GPU and no Ray it calls tune_many in process instead (its compiles
overlap the timing across specs).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from ..codegen import planner
from . import device, tuner
from .progress import Progress
from .tuner import TuneResults, TuneRun
from .tuning_db import DBKey, TuningDB, make_key

RESTARTS = 3          # fresh workers a local GPU gets after deaths before it is left out
STOP_WAIT_S = 5.0     # how long stopping workers may take before they are terminated


# --- tasks and what comes back -----------------------------------------------------------

@dataclass(frozen=True)
class Task:
    index: int                       # position in the run (the report's order)
    spec: object                     # a codegen Spec, as given (tune_many takes its execution spec)
    N: int
    K: int
    # (arch, device)s for which the user DB already serves every requested bucket
    done_on: FrozenSet[Tuple[str, str]] = frozenset()

    def name(self) -> str:
        return f"{self.spec.name} {self.N}x{self.K}"


@dataclass
class Outcome:
    """What one worker made of one task."""
    task: Task
    worker: str = ""                 # e.g. "gpu1", or a Ray node's address and GPU
    device: str = ""                 # its GPU's name ("" when it died before saying)
    results: Optional[TuneResults] = None     # None: skipped (in the DB already)
    kernels: int = 0
    kernels_failed: int = 0
    compile_s: float = 0.0
    seconds: float = 0.0             # wall time of the whole task in the worker
    interrupted: bool = False

    @property
    def skipped(self) -> bool:
        return self.results is None

    @property
    def failed(self) -> bool:
        return self.results is not None and not self.results.ok()


def failed_outcome(task: Task, worker: str, why: str, device_name: str = "") -> Outcome:
    res = TuneResults(None, task.spec.name, task.N, task.K)
    res.error, res.finished = why, True
    return Outcome(task, worker, device_name, res)


class _NoWrites(TuningDB):
    """The DB a worker's tune_many is given: its writes go nowhere, because
    the pair's TuneResults carry its records back to the driver, which
    stores them (the worker may be on another host)."""

    def __init__(self):
        super().__init__(os.devnull, shipped=False, quiet=True)

    def put_many(self, items) -> None:
        pass


def tune_task(task: Task, policy: dict, worker: str = "") -> Outcome:
    """Tune one task on this process's GPU (what every worker runs), or skip
    it when the DB already has it for this GPU.  policy: tune_many's keyword
    arguments (Ms, arch, workers, repeats, budget_ms, ...)."""
    t0 = time.perf_counter()
    arch, device_name = device_here(policy.get("arch"))
    if (arch, device_name) in task.done_on:
        return Outcome(task, worker, device_name)
    run = tuner.tune_many([task.spec], [(task.N, task.K)], db=_NoWrites(), progress=False,
                          **policy)
    return Outcome(task, worker, device_name, run.results[0], run.kernels, run.kernels_failed,
                   run.compile_s, time.perf_counter() - t0, run.interrupted)


TuneTask = Callable[[Task, dict, str], Outcome]       # tune_task, or a test's stand-in


# --- resume ------------------------------------------------------------------------------

def device_here(arch: Optional[str] = None) -> Tuple[str, str]:
    """(arch, device) of this process's GPU, as Task.done_on names them."""
    arch, device_name, _ = tuner._device_info(arch)
    return arch, device_name


def plan_tasks(pairs: Sequence[Tuple[object, int, int]], Ms, db,
               force: bool = False) -> List[Task]:
    """A Task per (spec, N, K), each with the (arch, device)s the user DB
    already serves every bucket of Ms for, tuned among the candidates the
    planner offers today (tuner.tuned_among_current; none with force).  db: a
    TuningDB or a path (None: the default).  Only the user file counts: a
    shipped record is no reason not to measure."""
    with warnings.catch_warnings():      # a second M of a bucket: tune_many says so
        warnings.simplefilter("ignore")
        buckets = set(tuner._bucket_Ms(Ms))
    user = TuningDB(db.path if isinstance(db, TuningDB) else db, shipped=False, quiet=True)
    seen: Dict[Tuple[int, int], Set[Tuple[str, str]]] = {}
    if not force:
        for entry in user.records("user"):
            try:
                k = DBKey.parse(entry.key)
            except ValueError:
                continue
            seen.setdefault((k.N, k.K), set()).add((k.arch, k.device))
    tasks = []
    for i, (spec, N, K) in enumerate(pairs):
        done = set()
        for arch, dev in seen.get((int(N), int(K)), ()):
            try:
                run = planner.execution_spec(spec, arch)
                key = make_key(run, N, K, arch=arch, device=dev)
            except Exception:        # an arch this spec cannot run on: not done there
                continue
            recs = user.lookup_all(key)
            if buckets <= set(recs) and all(tuner.tuned_among_current(run, arch, int(N), int(K), recs[b])
                                            for b in buckets):
                done.add((arch, dev))
        tasks.append(Task(i, spec, int(N), int(K), frozenset(done)))
    return tasks


# --- the run: progress, storing, tallies --------------------------------------------------

@dataclass
class DeviceTally:
    device: str
    workers: Set[str] = field(default_factory=set)
    tuned: int = 0                   # pairs with every bucket stored
    partial: int = 0                 # pairs with some bucket(s) not stored
    failed: int = 0                  # pairs not tuned at all (error, dead worker)
    skipped: int = 0
    records: int = 0
    busy_s: float = 0.0


@dataclass
class PoolRun:
    outcomes: List[Outcome]          # in task order
    total_s: float = 0.0
    interrupted: bool = False

    def tune_run(self) -> TuneRun:
        """The pairs worked on (not skipped) as one TuneRun, for the report."""
        done = [o for o in self.outcomes if not o.skipped]
        return TuneRun([o.results for o in done], kernels=sum(o.kernels for o in done),
                       kernels_failed=sum(o.kernels_failed for o in done),
                       compile_s=sum(o.compile_s for o in done), total_s=self.total_s,
                       interrupted=self.interrupted)

    def skipped(self) -> List[Outcome]:
        return [o for o in self.outcomes if o.skipped]

    def devices(self) -> List[DeviceTally]:
        tally: Dict[str, DeviceTally] = {}
        for o in self.outcomes:
            t = tally.setdefault(o.device or "(unknown)", DeviceTally(o.device or "(unknown)"))
            if o.worker:
                t.workers.add(o.worker)
            t.busy_s += o.seconds
            if o.skipped:
                t.skipped += 1
            elif o.results.error is not None:
                t.failed += 1
            else:
                t.records += len(o.results)
                if o.results.untuned:
                    t.partial += 1
                else:
                    t.tuned += 1
        return sorted(tally.values(), key=lambda t: t.device)


class Board:
    """The driver's view of a run: stores each pair's records as it comes
    back, and shows the progress over all workers."""

    def __init__(self, tasks: Sequence[Task], db: TuningDB, prog: Progress):
        self.total, self.db, self.prog = len(tasks), db, prog
        self.outcomes: Dict[int, Outcome] = {}
        self.busy: Dict[str, Task] = {}          # worker -> the task it is on

    def started(self, task: Task, worker: str) -> None:
        self.busy[worker] = task
        self._show()

    def finished(self, out: Outcome) -> None:
        res = out.results
        if res:                                  # some bucket(s) tuned: store them now
            self.db.put_many((res.key, b, rec) for b, rec in res.items())
        self.busy.pop(out.worker, None)
        self.outcomes[out.task.index] = out
        where = f"[{out.worker} {out.device}]".replace(" ]", "]")
        if out.skipped:
            what = "skipped (the DB has it for this device)"
        elif res.error is not None:
            what = f"NOT tuned: {res.error}"
        else:
            what = (f"stored {len(res)} bucket(s)" + (f", {len(res.untuned)} not" if res.untuned
                                                      else "") + f" in {out.seconds:.1f} s")
        self.prog.log(f"{len(self.outcomes)}/{self.total} {where} {out.task.name()}: {what}")
        self._show()

    def _show(self) -> None:
        n = len(self.outcomes)
        on = "  ".join(f"{w}: {t.name()}" for w, t in sorted(self.busy.items()))
        self.prog.show(f"tune {self.prog.bar(n, self.total)} {n}/{self.total} pairs  {on}")


def tune_pairs(pairs: Sequence[Tuple[object, int, int]], backend, *, Ms=None, db=None,
               force: bool = False, progress: bool = True, **policy) -> PoolRun:
    """Tune every (spec, N, K) of pairs on the backend's workers and store the
    winners in db (a TuningDB, a path, or None for the default) as each pair
    finishes; pairs the DB has for a worker's device are skipped unless
    force.  policy: tune_many's other keyword arguments (arch, workers,
    repeats, budget_ms, rank_budget_ms, finalists, seed).  Ctrl-C stops the
    run; what was stored stays (run.interrupted)."""
    t0 = time.perf_counter()
    if not isinstance(db, TuningDB):
        db = TuningDB(db)
    Ms = list(tuner._bucket_Ms(Ms).values())     # deduplicated (and warned of) once, here
    tasks = plan_tasks(pairs, Ms, db, force)
    policy = dict(policy, Ms=Ms)
    prog = Progress(progress)
    board = Board(tasks, db, prog)
    run = PoolRun([])
    try:
        backend.run(tasks, policy, board)
    except KeyboardInterrupt:
        run.interrupted = True
    prog.end()
    for t in tasks:                              # whatever never came back
        if t.index not in board.outcomes:
            why = "interrupted" if run.interrupted else "never came back from its worker"
            board.outcomes[t.index] = failed_outcome(t, "", why)
    run.outcomes = [board.outcomes[t.index] for t in tasks]
    run.interrupted = run.interrupted or any(o.interrupted for o in run.outcomes)
    run.total_s = time.perf_counter() - t0
    return run


# --- local worker processes --------------------------------------------------------------

def visible_gpus() -> List[str]:
    """The GPUs this process may use, each as a child's CUDA_VISIBLE_DEVICES
    names it: CUDA_VISIBLE_DEVICES's entries when it is set, else 0..count-1;
    [] without a usable GPU."""
    if not device.has_gpu():
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    import cupy
    return [str(i) for i in range(cupy.cuda.runtime.getDeviceCount())]


def compile_workers(gpus: int) -> int:
    """Compile processes per GPU worker: the cores shared out, one left to
    each worker's timing loop."""
    return max(1, (os.cpu_count() or 1) // max(gpus, 1) - 1)


def _worker_main(conn, gpu: str, label: str, tune: TuneTask) -> None:
    """A local worker: tune the tasks it is sent, one at a time, on its GPU."""
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu     # before anything touches CUDA here
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if msg is None:
            return
        task, policy = msg
        try:
            out = tune(task, policy, label)
        except KeyboardInterrupt:
            return
        except Exception as e:                   # this pair only (e.g. no GPU, a CUDA error)
            out = failed_outcome(task, label, f"{type(e).__name__}: {e}")
        conn.send(out)


def _death(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


class _Slot:
    """One GPU's worker process and the task it is on."""

    def __init__(self, ctx, gpu: str, tune: TuneTask):
        self.ctx, self.gpu, self.tune = ctx, gpu, tune
        self.label = f"gpu{gpu}"
        self.device = ""                 # its GPU's name, once a task has said
        self.deaths = 0
        self.task: Optional[Task] = None
        self.proc = self.conn = None
        self.start()

    def start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker_main, args=(child, self.gpu, self.label,
                                                                self.tune),
                                     # not a daemon: it starts compile processes
                                     name=f"opgen-tune-{self.label}")
        self.proc.start()
        child.close()

    def send(self, task: Task, policy: dict) -> None:
        self.task = task
        try:
            self.conn.send((task, policy))
        except OSError:              # it just died: its sentinel says so, receive() reports it
            pass

    def receive(self) -> Outcome:
        """The outcome of its task; a worker found dead loses only that."""
        task, self.task = self.task, None
        try:
            out = self.conn.recv()
            self.device = out.device or self.device
            return out
        except (EOFError, OSError):
            pass
        self.proc.join(STOP_WAIT_S)
        self.deaths += 1
        return failed_outcome(task, self.label, f"worker {self.label} died "
                              f"({_death(self.proc.exitcode)}) while tuning it; a rerun resumes",
                              self.device)

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(STOP_WAIT_S if self.task is None else 0.5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(STOP_WAIT_S)
        self.conn.close()


class LocalWorkers:
    """One spawned worker process per GPU (CUDA_VISIBLE_DEVICES set to it),
    each sent one task at a time.  tune: what each worker runs per task
    (tune_task; tests give a stand-in)."""

    def __init__(self, gpus: Sequence[str], tune: TuneTask = tune_task):
        if not gpus:
            raise ValueError("LocalWorkers needs at least one GPU")
        self.gpus, self.tune = [str(g) for g in gpus], tune

    def run(self, tasks: Sequence[Task], policy: dict, board: Board) -> None:
        if policy.get("workers") is None:
            policy = dict(policy, workers=compile_workers(len(self.gpus)))
        queue = deque(tasks)
        ctx = multiprocessing.get_context("spawn")   # CUDA and fork do not mix
        slots = [_Slot(ctx, g, self.tune) for g in self.gpus]
        try:
            for s in slots:
                self._feed(s, queue, policy, board)
            while any(s.task is not None for s in slots):
                busy = [s for s in slots if s.task is not None]
                ready = set(wait([s.conn for s in busy] + [s.proc.sentinel for s in busy]))
                for s in busy:
                    if s.conn in ready or s.proc.sentinel in ready:
                        board.finished(s.receive())
                        if not s.proc.is_alive() and queue and s.deaths <= RESTARTS:
                            s.start()            # a fresh worker for this GPU
                        self._feed(s, queue, policy, board)
            for t in queue:                      # every GPU's worker kept dying
                board.finished(failed_outcome(t, "", "no worker left (each kept dying)"))
        finally:
            for s in slots:
                s.stop()

    @staticmethod
    def _feed(slot: _Slot, queue: deque, policy: dict, board: Board) -> None:
        if queue and slot.proc.is_alive():
            task = queue.popleft()
            slot.send(task, policy)
            board.started(task, slot.label)

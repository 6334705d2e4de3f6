"""Compiling a run's kernels while the GPU works: every kernel submitted at
once to codegen.compiler.compile_many (worker processes: NVRTC is
CPU-bound and single-threaded), drained by a background thread, so the GPU
times what is compiled while the rest compiles (NVRTC would otherwise leave
it idle for minutes).  Used by the tuner (per spec: wait(spec)) and `opgen
bench` (wait_all).

Compilation uses 'spawn' worker processes: a script that compiles this way
must guard its top level with `if __name__ == "__main__":` (as with any
multiprocessing).
"""
from __future__ import annotations

import threading
import time
from typing import Dict, Optional, Sequence

from ..codegen.compiler import compile_many
from .progress import Progress


def _with_arch(job: tuple, arch) -> tuple:
    """(spec, config[, pdl]) -> compile_many's (spec, config, arch[, pdl])."""
    return job[:2] + (arch,) + job[2:]


def compile_all(jobs: Sequence[tuple], arch, workers: int, done,
                stop=lambda: False) -> None:
    """Compile (spec, config) jobs ((spec, config, True): the pdl kernels)
    through compile_many, calling done(job, None | why not) as each
    finishes; stop() true ends it early (the queued jobs are dropped)."""
    if workers <= 1 or len(jobs) <= 1:
        # In this process, one job at a time: an unexpected exception (a
        # compiler bug) drops that config only.  (In worker processes every
        # exception comes back as the why.)
        for job in jobs:
            try:
                for _, why in compile_many([_with_arch(job, arch)], 1):
                    done(job, why)
            except Exception as e:                 # a compiler bug: drop, but say so
                done(job, f"{type(e).__name__}: {e}")
            if stop():
                return
        return
    back = {_with_arch(job, arch): job for job in jobs}
    for full, why in compile_many(list(back), workers):
        done(back[full], why)
        if stop():                     # leaving the loop closes compile_many: it drops the rest
            return


class Compiles:
    """Every kernel of a run in one compile_many pool, all submitted at the
    start, in the order they will be needed.  With workers > 1 a background
    thread drains the pool; wait(spec) blocks until every kernel of spec's
    configs is done, wait_all() until all are.  (The timing loop is Python
    and needs a core of its own: callers leave it one.)  With workers = 1
    everything compiles first, in this process.

    stages: {(spec, config): the (spec, config) kernels it launches} (a
    key and its jobs may carry a third element, True: the pdl kernels)."""

    def __init__(self, stages: Dict[tuple, list], arch, workers: int,
                 prog: Optional[Progress] = None):
        self.stages, self.prog = stages, prog or Progress(False)
        self.jobs = list(dict.fromkeys(j for st in stages.values() for j in st))
        self.owners: Dict[tuple, set] = {}
        for key, st in stages.items():
            for j in st:
                self.owners.setdefault(j, set()).add(key[0])
        self.pending: Dict[object, int] = {}
        for specs in self.owners.values():
            for spec in specs:
                self.pending[spec] = self.pending.get(spec, 0) + 1
        self.status: Dict[tuple, Optional[str]] = {}
        self.t0 = time.perf_counter()
        self.seconds: Optional[float] = None           # until the last kernel was done
        self._announced = False
        self._cond = threading.Condition()
        self._stop = False
        self.thread: Optional[threading.Thread] = None
        if workers > 1 and len(self.jobs) > 1:
            self.thread = threading.Thread(target=self._drain, args=(arch, workers), daemon=True,
                                           name="opgen-compile")
            self.thread.start()
        else:
            compile_all(self.jobs, arch, 1, self._done)

    def _done(self, job, why) -> None:
        with self._cond:
            self.status[job] = why
            for spec in self.owners[job]:
                self.pending[spec] -= 1
            n = len(self.status)
            if n == len(self.jobs):
                self.seconds = time.perf_counter() - self.t0
            self._cond.notify_all()
        if self.thread is None:        # (the drain thread leaves the progress line alone)
            self.prog.show(self._progress_text(), milestone=n == len(self.jobs))

    def _drain(self, arch, workers: int) -> None:
        try:
            compile_all(self.jobs, arch, workers, self._done, stop=lambda: self._stop)
        except Exception as e:          # the pool itself broke: what is left failed
            for job in self.jobs:
                if job not in self.status:
                    self._done(job, f"{type(e).__name__}: {e}")

    def _progress_text(self) -> str:
        n = len(self.status)
        return f"compile {self.prog.bar(n, len(self.jobs))} {n}/{len(self.jobs)}  failed {self.failed()}"

    def wait(self, spec) -> None:
        """Until every kernel of spec's configs is done."""
        with self._cond:
            while self.pending.get(spec, 0) > 0:
                self._cond.wait(timeout=0.2)
                self.prog.show(f"{self._progress_text()}  (waiting for {spec.name})")
        self._announce()

    def wait_all(self) -> None:
        with self._cond:
            while len(self.status) < len(self.jobs):
                self._cond.wait(timeout=0.2)
                self.prog.show(self._progress_text())
        self._announce()

    def _announce(self) -> None:
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
        """Stop after the kernel in flight (the queued ones are dropped)."""
        self._stop = True

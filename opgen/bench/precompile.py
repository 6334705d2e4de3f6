"""Compiling ahead what `opgen bench` will run, in the background while the
machine and the peers are timed (runtime.compile_pool)."""
from __future__ import annotations

import os
from typing import List, Optional

from ..codegen.buckets import bucket_of
from ..runtime.compile_pool import Compiles
from ..runtime.op import MatmulOp, quantize_spec
from .failures import short_error
from .opgen_rows import LINEAR_INPUT


def compile_jobs(specs, shapes, Ms, db, use_db: bool, arch: str, pdl_Ms=()) -> List[tuple]:
    """(spec, config) of every kernel opgen.load will pick: the DB record of
    the bucket, else the planner's heuristic, as MatmulOp chooses (config
    None: the quantize kernel of the fused linear); for the Ms in pdl_Ms
    also (spec, config, True), its kernels for a programmatic dependent
    launch (graph mode's).  A miss only means that kernel compiles later,
    serially."""
    jobs = {}
    for spec in specs:
        for N, K in shapes:
            try:
                op = MatmulOp(spec, N, K, arch=arch, db=db, use_db=use_db and db is not None)
            except Exception:           # a shape the spec cannot run: its rows say so
                continue
            pdl_labels = {bucket_of(M) for M in pdl_Ms}
            for label in dict.fromkeys(bucket_of(M) for M in Ms):
                try:
                    # the heuristic's first pick: a spilling one is passed over (and
                    # its successor compiled) when the op first runs it
                    cfg = op.choose(label, compiled=False)
                except Exception:
                    continue
                jobs[op.kernel_spec, cfg] = None
                if label in pdl_labels:
                    jobs[op.kernel_spec, cfg, True] = None
        if spec.a.scale == "row":      # the quantize kernel of opgen's fused linear
            jobs[quantize_spec(spec, LINEAR_INPUT), None] = None
    return list(jobs)


def start(jobs, arch: str, workers: Optional[int], log) -> Optional[Compiles]:
    """Start compiling `jobs` and return at once (None when nothing is left to
    wait for): the caller times the machine and the peers meanwhile, then
    calls wait (or cancel).  One core is left to the timing loop."""
    if not jobs:
        return None
    workers = max(1, min(workers or max(1, (os.cpu_count() or 1) - 1), len(jobs)))
    log(f"compiling {len(jobs)} kernels ({workers} processes)")
    try:
        return Compiles({job: [job] for job in jobs}, arch, workers)
    except Exception as e:             # nothing compiled ahead: the rows compile their own
        log(f"compiling ahead failed: {short_error(e)}")
        return None


def wait(compiles: Optional[Compiles], log) -> None:
    if compiles is None:
        return
    compiles.wait_all()
    log(f"compiled {len(compiles.jobs)} kernels in {compiles.seconds or 0.0:.1f} s "
        f"({compiles.failed()} failed; those rows will say why)")


def cancel(compiles: Optional[Compiles]) -> None:
    """Stop after the kernel in flight (the queued ones are dropped)."""
    if compiles is not None:
        compiles.close()

"""Tuning on a Ray cluster (`opgen tune --ray [ADDRESS]`): the tune_pool
backend whose workers are Ray tasks, one (spec, N, K) pair each, each
holding one GPU (num_gpus=1: Ray sets its CUDA_VISIBLE_DEVICES) and its
share of the cores for its compiles.  The kernels compile inside the task,
in its own compile pool (tuner.tune_many): a compile elsewhere would leave
its cubin on another node.  Winners come back to the driver, which stores
them (tune_pool.Board).  max_retries=0: a task whose worker dies is
reported failed, not run again (a rerun resumes).

Ray is an optional extra (pip install 'opgen[ray]'), imported only when
this backend runs; every node needs opgen with its CUDA extra.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..codegen.errors import UserError
from .device import NoGPUError
from .tune_pool import Board, Outcome, Task, TuneTask, failed_outcome, tune_task


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'opgen[ray]'") from None
    return ray


def _run_on_gpu(tune: TuneTask, task: Task, policy: dict) -> Outcome:
    """The Ray task: one pair on the GPU Ray gave it."""
    import ray
    worker = (f"{ray.util.get_node_ip_address()}:gpu"
              + ",".join(str(g) for g in ray.get_gpu_ids()))
    try:
        return tune(task, policy, worker)
    except Exception as e:                      # this pair only, as with local workers
        return failed_outcome(task, worker, f"{type(e).__name__}: {e}")


def _why(error: Exception) -> str:
    ray = _ray()
    if isinstance(error, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
        return f"its Ray worker died while tuning it ({type(error).__name__}); a rerun resumes"
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"


class RayWorkers:
    """address: the cluster's (e.g. "auto", "ray://head:10001"); None: the
    one RAY_ADDRESS names, else a local one (unless Ray is initialized
    already: then that).  cpus_per_task: cores each pair holds (default: the
    cluster's cores per GPU).  tune: what each task runs (tune_task; tests
    give a stand-in).  init: more ray.init arguments."""

    def __init__(self, address: Optional[str] = None, tune: TuneTask = tune_task,
                 cpus_per_task: Optional[int] = None, **init):
        self.address, self.tune, self.cpus_per_task, self.init = address, tune, cpus_per_task, init

    def run(self, tasks: Sequence[Task], policy: dict, board: Board) -> None:
        ray = _ray()
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.address or None, **self.init)
        try:
            self._run(ray, tasks, policy, board)
        finally:
            if started:
                ray.shutdown()

    def _run(self, ray, tasks: Sequence[Task], policy: dict, board: Board) -> None:
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        if gpus < 1:
            raise NoGPUError("the Ray cluster has no GPU (a task of `opgen tune --ray` "
                             "holds one)")
        cpus = self.cpus_per_task or max(1, int(resources.get("CPU", 1)) // gpus)
        if policy.get("workers") is None:       # the compile processes of each task
            policy = dict(policy, workers=max(1, cpus - 1))
        remote = ray.remote(num_gpus=1, num_cpus=cpus, max_retries=0)(_run_on_gpu)
        pending = {remote.remote(self.tune, t, policy): t for t in tasks}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    task = pending.pop(ref)
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        out = failed_outcome(task, "ray", _why(e))
                    board.finished(out)
        finally:
            for ref in pending:                 # Ctrl-C, or the DB would not take a write
                ray.cancel(ref, force=True)

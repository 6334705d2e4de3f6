"""A stand-in GPU for the worker tests of tune_pool.py and tune_ray.py:
FakeTuner runs the real tune_pool.tune_task (so tuner.tune_many, its
compile pool, rank and final passes) with the tuner's hooks replaced by
fakes in the worker's own process: a fixed timer whose winner depends on
the device, a fake compiler (compile_fakes), a device named after the
worker's CUDA_VISIBLE_DEVICES.  A pair of the spec named DIE kills its
worker (SIGKILL), as a crash of the GPU driver would."""
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass

from opgen.runtime import compile_pool, tune_pool, tuner, tuning_db
from opgen.runtime.timing import Timing

from compile_fakes import FakeConfig, fake_compile_many

DIE = "crash_fake"






# us per config on each fake device: "a" wins on A, "b" on B
TIMES = {"Fake GPU A": {"a": 5.0, "b": 6.0}, "Fake GPU B": {"a": 6.0, "b": 4.0}}


class FakeProblem:
    def __init__(self, times):
        self.times = times

    def select(self, M):
        pass

    def rank(self, cfg, best_us=None, *, budget_ms, drop_ratio):
        return Timing(self.times[cfg.name], [self.times[cfg.name]])

    def time(self, cfg, *, estimate_us, budget_ms, repeats):
        return Timing(self.times[cfg.name], [self.times[cfg.name]] * 3)

    def verify(self, cfg, tol):
        return True, 1e-4, ""

    def close(self):
        pass


class FakeSession:
    def __init__(self, arch):
        self.arch = arch

    def problem(self, spec, N, K, seed):
        return FakeProblem(TIMES[tuner._device_info(None)[1]])

    def kernel(self, spec, cfg):
        return cfg

    def forget(self, spec):
        pass

    def close(self):
        pass


def install(device_name: str, put=setattr) -> None:
    """Replace the tuner's hooks by the fakes (put: setattr in a worker,
    monkeypatch.setattr in the test's own process)."""
    put(tuner, "_device_info", lambda arch: (arch or "sm_90", device_name, "12.9"))
    put(tuner, "_candidates", lambda spec, arch, M, N, K: [FakeConfig("a"), FakeConfig("b")])
    put(tuner, "_heuristic", lambda spec, arch, M, N, K: FakeConfig("a"))
    put(tuner, "_stages", lambda spec, cfg: [(spec, cfg)])
    put(tuner, "_make_session", FakeSession)
    put(compile_pool, "compile_many", fake_compile_many)
    # Fake configs do not render: their records' source hash is their name.
    put(tuning_db, "rendered_hash", lambda key, config: f"src-{config['name']}")


@dataclass(frozen=True)
class FakeTuner:
    """What a worker runs per task (tune_pool.TuneTask): the fakes, then
    the real tune_task.  devices: CUDA_VISIBLE_DEVICES -> device name.
    child: start a process first, as the compile pool does (a worker must
    be allowed children)."""
    devices: tuple = (("0", "Fake GPU A"), ("1", "Fake GPU B"))
    sleep_s: float = 0.0
    child: bool = False

    def __call__(self, task, policy, worker):
        install(dict(self.devices)[os.environ.get("CUDA_VISIBLE_DEVICES", "")])
        if task.spec.name == DIE:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.child:
            p = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
            p.start()
            p.join()
        time.sleep(self.sleep_s)
        return tune_pool.tune_task(task, policy, worker)


class InProcess:
    """A backend that runs every task here, one after another, as the
    given device (for the resume tests: no processes to start)."""

    def __init__(self, device_name: str, monkeypatch):
        install(device_name, monkeypatch.setattr)

    def run(self, tasks, policy, board):
        for t in tasks:
            board.started(t, "here")
            board.finished(tune_pool.tune_task(t, policy, "here"))

"""The GPU side of `opgen bench` (opgen/bench/runner.py). On the CPU: what a
Gpu refuses without torch or CUDA, how many input copies it rotates within
the memory it may use, its torch graph capture (behind a fake torch), its log
line and its environment record (which never fails a run); on the GPU (gpu
mark): a real Gpu on the current device."""
import contextlib
import re
import sys
import types

import pytest

from opgen import __version__
from opgen.bench import runner
from opgen.bench.runner import Gpu
from opgen.codegen.errors import UserError
from opgen.runtime import timing
from opgen.runtime.device import current_arch


def test_needs_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)              # import torch fails
    with pytest.raises(UserError, match="needs torch"):
        Gpu(budget_ms=1, mem_cap=1 << 30)


def test_needs_a_cuda_gpu(monkeypatch):
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", torch)
    with pytest.raises(UserError, match=r"needs a CUDA GPU \(torch.cuda.is_available\(\) is False\)"):
        Gpu(budget_ms=1, mem_cap=1 << 30)


def _bare_gpu(free: int, mem_cap: int, l2: int):
    g = object.__new__(Gpu)
    g.cp = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(memGetInfo=lambda: (free, 16 << 30),
                                      driverGetVersion=lambda: 12080,
                                      runtimeGetVersion=lambda: 12090)),
        __version__="13.4.0")
    g.l2, g.mem_cap = l2, mem_cap
    return g


def test_n_copies_stay_within_a_quarter_of_free_memory_and_the_cap():
    """Copies enough to flush the L2, but no more than min(mem_cap, free / 4)."""
    MiB = 1 << 20
    assert _bare_gpu(free=1 << 40, mem_cap=1 << 40, l2=64 * MiB).n_copies(MiB) == 128
    assert _bare_gpu(free=64 * MiB, mem_cap=1 << 40, l2=64 * MiB).n_copies(MiB) == 16
    assert _bare_gpu(free=1 << 40, mem_cap=32 * MiB, l2=64 * MiB).n_copies(MiB) == 32
    g = _bare_gpu(free=1 << 34, mem_cap=1 << 32, l2=50 * MiB)
    assert g.n_copies(3 * MiB) == timing.n_copies(3 * MiB, 50 * MiB, 1 << 32)


def test_gpu_capture_warms_up_then_captures():
    """runner.Gpu.capture: one eager run on a side stream, then the capture
    (thread-local errors), the replay returned."""
    log = []

    class Graph:
        def replay(self):
            log.append("replay")

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            log.append("wait")

    @contextlib.contextmanager
    def graph_ctx(g, capture_error_mode):
        log.append(f"capture {capture_error_mode}")
        yield
        log.append("captured")
    cuda = types.SimpleNamespace(
        Stream=Stream, current_stream=lambda dev: Stream(), CUDAGraph=Graph, graph=graph_ctx,
        stream=lambda s: contextlib.nullcontext(), synchronize=lambda dev: log.append("sync"))
    g = object.__new__(Gpu)
    g.torch, g.dev = types.SimpleNamespace(cuda=cuda), "cuda:0"
    replay = g.capture(lambda: log.append("call"))
    assert log == ["wait", "call", "wait", "sync", "capture thread_local", "call", "captured", "sync"]
    replay()
    assert log[-1] == "replay"


def test_log_line(capsys):
    g = object.__new__(Gpu)
    g.t0 = 0.0
    g.log("timing peers")
    assert re.fullmatch(r"\[ *\d+\.\ds\] timing peers\n", capsys.readouterr().err)


def test_env_records_what_it_can(monkeypatch):
    """The environment a run records: what cannot be read is written down
    as unknown with the reason, never raised."""
    g = _bare_gpu(free=1 << 34, mem_cap=1 << 32, l2=50 << 20)

    def no_nvrtc():
        raise OSError("libnvrtc.so not found\nsearched: ...")
    monkeypatch.setattr(runner.device, "device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(runner.device, "sm_count", lambda: 132)
    monkeypatch.setattr(runner.device, "nvrtc_version", no_nvrtc)
    g.torch = types.SimpleNamespace(__version__="2.6.0", version=types.SimpleNamespace(cuda="12.6"),
                                    cuda=types.SimpleNamespace(get_device_properties=lambda d: 1 / 0))
    g.arch, g.dev = "sm_90", 0
    env = g.env()
    assert {k: env[k] for k in ("device", "arch", "sm_count", "torch", "torch_cuda", "cupy", "opgen",
                                "l2_bytes", "driver", "cuda_runtime")} == {
        "device": "NVIDIA H200", "arch": "sm_90", "sm_count": 132, "torch": "2.6.0",
        "torch_cuda": "12.6",
        "cupy": "13.4.0", "opgen": __version__, "l2_bytes": 50 << 20, "driver": 12080,
        "cuda_runtime": 12090}
    assert env["nvrtc"] == "unknown (OSError: libnvrtc.so not found)"
    assert "memory_bytes" not in env


@pytest.mark.gpu
def test_gpu_on_the_device():
    """A Gpu on the current device: its environment, one timer for torch
    work, the copies that fit, memory handed back."""
    torch = pytest.importorskip("torch")
    g = Gpu(budget_ms=5, mem_cap=8 << 30)
    env = g.env()
    assert env["arch"] == current_arch() == g.arch and env["sm_count"] > 0
    assert env["memory_bytes"] > 0 and env["l2_bytes"] == g.l2 > 0
    assert not str(env["nvrtc"]).startswith("unknown")
    a = torch.ones((1024, 1024), device=g.dev, dtype=torch.float16)
    t = g.measure(lambda i: torch.mm(a, a))
    assert 0 < t.median_us < 10_000 and t.samples
    assert 2 <= g.n_copies(1 << 20) <= 4096
    g.free()

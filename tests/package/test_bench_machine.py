"""The machine `opgen bench` measures (opgen/bench/machine.py): ceilings
with torch CPU tensors, the read-only kernel on a GPU."""
import pytest

from bench_fakes import fake_gpu
from opgen.bench import machine
from opgen.bench.runner import Gpu


def test_measure_machine_with_torch_cpu(monkeypatch):
    torch = pytest.importorskip("torch")
    g = fake_gpu(monkeypatch, torch)
    g.log = lambda text: None
    m = machine.measure_machine(g, copy_bytes=1 << 16, peak_s=64)
    assert m["copy_bytes"] == 2 << 16
    assert m["copy_tbps"] == pytest.approx((2 << 16) / 7.5 / 1e6, abs=1e-4)
    assert m["fp16_tflops"] == pytest.approx(2 * 64 ** 3 / 7.5 / 1e6, abs=0.01)
    # a ceiling torch cannot measure here is an error string, not an exception
    for k in ("int8", "fp8"):
        assert (f"{k}_error" in m) != any(x.startswith(k) and not x.endswith("error") for x in m)


@pytest.mark.gpu
def test_read_time_on_gpu():
    """The read-only kernel: no faster than HBM allows (5 TB/s is above any
    H100/H200 part), cached per size."""
    pytest.importorskip("torch")
    g = Gpu(budget_ms=5, mem_cap=8 << 30)
    nbytes = 32 << 20
    t = g.read_time(nbytes)
    assert t is not None and nbytes / 5e6 < t < 1000.0
    assert g.read_time(nbytes - 4) == t           # same 16-byte words: from the cache

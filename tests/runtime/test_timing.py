"""runtime.timing: the GPU timer and the number of rotating input copies.

The CPU tests drive Timer.measure's sampling policy with a fake _samples; the
`gpu` test times real kernels and needs an NVIDIA GPU.
"""
import pytest

from opgen.runtime import timing, tuner
from opgen.runtime.timing import Timer, n_copies




def test_n_copies():
    l2 = 60 << 20
    assert n_copies(1 << 20, l2, 2 << 30) == 120          # 2x L2 in 1 MiB sets
    assert n_copies(500 << 20, l2, 2 << 30) == 2          # bigger than L2: two
    assert n_copies(1 << 20, l2, 16 << 20) == 16          # memory cap wins
    assert n_copies(4 << 30, l2, 2 << 30) == 1


class _NullStream:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def synchronize(self):
        pass


def _fake_timer(us):
    t = object.__new__(Timer)
    t.stream = _NullStream()
    t.host_us = None
    t.calls = []

    def samples(launch, start, count, L, host_us, gpu_us):
        t.calls.append((start, count, L))
        for j in range(start, start + count * L):
            launch(j)
        return [us] * count
    t._samples = samples
    return t


def test_measure_adaptive_and_early_drop():
    launches = []
    t = _fake_timer(4.0)
    r = t.measure(launches.append, None, budget_us=30_000)
    assert not r.dropped and r.median_us == 4.0
    assert len(r.samples) == timing.MAX_SAMPLES               # 4 us, L=5: budget allows > max
    assert launches == list(range(len(launches)))             # i counts up: buffers rotate
    assert t.calls[1][2] == 5                                 # L * 4 us >= MIN_SAMPLE_US

    t = _fake_timer(10.0)
    r = t.measure(lambda i: None, best_us=5.0, budget_us=30_000)
    assert r.dropped and len(r.samples) == timing.EARLY_SAMPLES

    t = _fake_timer(10.0)
    r = t.measure(lambda i: None, best_us=8.0, repeats=7)
    assert not r.dropped and len(r.samples) == 7


def test_measure_with_an_estimate_skips_warm_up_and_probe():
    """The tuner's final pass knows the kernel's time from the rank pass: a
    20 ms kernel then costs its samples only (5 launches at MIN_SAMPLES, not
    3 warm-up + 5 host-timed + 5 probe launches more)."""
    launches = []
    t = _fake_timer(20_000.0)
    r = t.measure(launches.append, budget_us=10_000, estimate_us=20_000.0)
    assert len(r.samples) == timing.MIN_SAMPLES and launches == list(range(timing.MIN_SAMPLES))
    assert t.calls[0] == (0, timing.EARLY_SAMPLES, 1)

    launches = []
    t = _fake_timer(20_000.0)
    t.measure(launches.append, budget_us=10_000)
    assert len(launches) == 3 + 5 + 5 + timing.MIN_SAMPLES


def test_rank_is_cheap():
    # A long kernel: the probe, then one sample (the budget is below one launch).
    launches = []
    t = _fake_timer(5_000.0)
    r = t.rank(launches.append, None, budget_us=1_000)
    assert t.calls == [(0, 1, 1), (1, 1, 1)] and launches == [0, 1]
    assert not r.dropped and r.samples == [5_000.0]          # the probe is not a sample
    # ... clearly slower than the best: dropped on the probe, one launch in all.
    t = _fake_timer(5_000.0)
    r = t.rank(lambda i: None, 1_000.0, budget_us=1_000)
    assert r.dropped and t.calls == [(0, 1, 1)]

    # A short kernel: samples of L launches (L * 4 us >= MIN_SAMPLE_US), at most
    # RANK_SAMPLES of them.
    t = _fake_timer(4.0)
    r = t.rank(lambda i: None, None, budget_us=1_000_000)
    assert not r.dropped and len(r.samples) == timing.RANK_SAMPLES
    assert t.calls[0] == (0, 1, 1) and all(L == 5 for _, _, L in t.calls[1:])
    # ... never dropped on the probe alone (a launch gap would be a large part
    # of it), but after its first samples.
    t = _fake_timer(4.0)
    r = t.rank(lambda i: None, 1.0, budget_us=1_000_000)
    assert r.dropped and t.calls == [(0, 1, 1), (1, timing.EARLY_SAMPLES, 5)]


def test_tuner_and_bench_share_the_timer():
    assert tuner.Timing is timing.Timing
    assert tuner.BUDGET_MS == timing.BUDGET_MS and tuner.DROP_RATIO == timing.DROP_RATIO


# --- on the GPU --------------------------------------------------------------------------

@pytest.mark.gpu   # skipped without a GPU (tests/conftest.py)
def test_timer_on_gpu():
    """The timer measures the kernel, not Python's launch overhead, and a
    memory-bound kernel's time matches its bytes."""
    import cupy as cp
    timer = Timer()
    tiny = cp.RawKernel(r'extern "C" __global__ void t(float* x) { x[threadIdx.x] += 1.0f; }', "t")
    x = cp.zeros(32, dtype=cp.float32)
    r = timer.measure(lambda i: tiny((1,), (32,), (x,)), budget_us=20_000)
    print("tiny kernel:", r.median_us, "us")
    assert 0.3 < r.median_us < 6.0

    n = 64 << 20                                   # 256 MiB per float32 buffer
    src, dst = cp.ones(n, cp.float32), cp.empty(n, cp.float32)
    r = timer.measure(lambda i: cp.copyto(dst, src), budget_us=20_000)
    gbps = 2 * n * 4 / (r.median_us * 1e-6) / 1e9
    print("copy:", r.median_us, "us,", gbps, "GB/s")
    assert 100 < gbps < 10_000

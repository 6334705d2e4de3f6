"""GPU timing shared by the tuner and `opgen bench`: `Timer` (the median
device time of a launch function) and `n_copies` (how many input sets to
rotate through so that a launch does not find its data in L2).

Why CUDA events behind a spin kernel: a decode-sized kernel runs for a few
microseconds, often less than Python takes to enqueue it.  Timed naively
(events around launches issued from Python) the GPU would wait on the CPU
and we would measure Python's launch cost.  So each group of samples is
enqueued behind a spin kernel that keeps the GPU busy until the CPU is far
enough ahead; the launches then run back to back, as they do in a CUDA graph
or a real model, and the events between them measure device time only.  A
sample covers enough launches to span MIN_SAMPLE_US, far above the event
resolution (~0.5 us), and the median of the samples resists interruptions.

Why rotating copies over the L2: timing the same buffers over and over
leaves the weights in L2 (50+ MiB on recent GPUs), so a memory-bound kernel
would look faster than it is in a model, where the other layers' weights pass
through L2 in between.  The caller keeps n_copies(...) input/output sets and
launch i uses set i % n, so every set has been evicted before it is used
again.

Two strengths of measurement: `measure` (the full budget, BUDGET_MS) and
`rank` (RANK_BUDGET_MS, at most RANK_SAMPLES samples, no separate warm-up),
cheap enough to run on every candidate of a tuning run so that only the
fastest few are measured in full.

cupy is imported inside Timer, so this module imports without a GPU.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import List

import numpy as np

# Timing policy (see Timer.measure).
BUDGET_MS = 30.0          # default measured device time per measurement
MIN_SAMPLE_US = 20.0      # one sample spans >= this, far above the event resolution (~0.5 us)
EARLY_SAMPLES = 3         # samples taken before deciding whether to drop a slow config
MIN_SAMPLES, MAX_SAMPLES = 5, 100
CHUNK_SAMPLES = 25        # samples enqueued behind one spin
DROP_RATIO = 1.5          # drop a config this much slower than the best so far
RANK_BUDGET_MS = 1.0      # rank(): device time per candidate...
RANK_SAMPLES = 5          # ...and at most this many samples
HOST_US_GUESS = 30.0      # Python's cost of one launch until measured (a generous guess:
                          # too high only lengthens the spin)

_SPIN_SRC = r"""
extern "C" __global__ void opgen_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


@dataclass
class Timing:
    median_us: float
    samples: List[float]
    dropped: bool = False          # stopped early: clearly slower than the best


def n_copies(per_copy: int, l2: int, cap: int) -> int:
    """How many input/output sets to rotate through.  Launch i uses set
    i % n, so a set was last touched n - 1 launches ago; with all sets
    together over twice the L2 it has been evicted by then, as in a real model
    where the weights of the other layers pass through L2 in between.  A set
    larger than the L2 evicts itself, but two sets still avoid re-reading the
    tail of the previous launch.  Memory use stays under `cap`."""
    want = max(2, math.ceil(2 * l2 / max(per_copy, 1)))
    return max(1, min(want, cap // max(per_copy, 1), 4096))


class Timer:
    """CUDA-event timing of a launch function on one stream (see measure)."""

    def __init__(self, stream=None):
        import cupy as cp
        self.cp = cp
        self.stream = stream or cp.cuda.Stream(non_blocking=True)
        self._spin = cp.RawKernel(_SPIN_SRC, "opgen_spin")
        dev = cp.cuda.Device()
        khz = dev.attributes.get("ClockRate", 0) or \
            cp.cuda.runtime.getDeviceProperties(dev.id).get("clockRate", 0)
        self.clock_khz = int(khz) or 2_000_000
        self.host_us = None        # Python's cost of one launch, as last measured by _samples

    def measure(self, launch, best_us=None, *, budget_us=BUDGET_MS * 1e3, repeats=None,
                drop_ratio=DROP_RATIO, estimate_us=None) -> Timing:
        """Median device time of one launch(i), in microseconds; launch(i)
        enqueues one launch on self.stream (i counts up, to rotate buffers).

        * Warm-up launches first: the first one loads the module.
        * Python enqueues a launch in several microseconds, often slower than
          a decode kernel runs; timed naively the GPU would wait on the CPU and
          we would measure Python.  So each group of samples is enqueued behind
          a spin kernel that keeps the GPU busy until the CPU is far enough
          ahead; the launches then run back to back, as in a CUDA graph.
        * One sample = the CUDA-event time of L consecutive launches / L, with
          L chosen so a sample spans >= MIN_SAMPLE_US, well above the event
          resolution; the median of the samples resists interruptions.
        * The number of samples fits a time budget; after EARLY_SAMPLES a
          config slower than drop_ratio * best_us is abandoned (dropped=True).
        * estimate_us: a recent time of this launch (e.g. rank's): the kernel
          is warm and its time known, so the warm-up and the probe are skipped
          (for a 20 ms kernel they would be 13 of the 18 launches).
        """
        with self.stream:
            if estimate_us is None:
                i, gpu_us, host_us = self._warm_up(launch)
            else:
                i, gpu_us, host_us = 0, float(estimate_us), self._host_guess()
            return self._sample_to_budget(launch, i, gpu_us, host_us, best_us, budget_us,
                                          repeats, drop_ratio, MIN_SAMPLES, MAX_SAMPLES)

    def rank(self, launch, best_us=None, *, budget_us=RANK_BUDGET_MS * 1e3,
             drop_ratio=DROP_RATIO, max_samples=RANK_SAMPLES) -> Timing:
        """A cheap time of launch(i) for ranking many candidates (the tuner's
        first pass): as measure, but on budget_us and at most max_samples
        samples, and without the warm-up: the first launch (the probe) is timed
        alone behind a spin.  The probe can only read slow (it carries any
        first-call setup, e.g. zeroing a split-K workspace, which is small next
        to the kernel's own traffic), so a probe over drop_ratio * best_us
        drops the config at once: a clearly slow 20 ms kernel costs one launch.
        Not for probes under MIN_SAMPLE_US, where a launch gap of a microsecond
        or two would be a large part of the reading."""
        with self.stream:
            host_us = self._host_guess()
            probe = self._samples(launch, 0, 1, 1, host_us, 0.0)[0]
            if best_us is not None and probe >= MIN_SAMPLE_US and probe > drop_ratio * best_us:
                return Timing(probe, [probe], dropped=True)
            return self._sample_to_budget(launch, 1, probe, host_us, best_us, budget_us, None,
                                          drop_ratio, 1, max_samples)

    def _host_guess(self) -> float:
        return self.host_us if self.host_us is not None else HOST_US_GUESS

    def _warm_up(self, launch):
        """(launches made, device us per launch, host us per launch)."""
        s = self.stream
        i = 0
        for _ in range(3):
            launch(i)
            i += 1
        s.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            launch(i)
            i += 1
        host_us = (time.perf_counter() - t0) / 5 * 1e6
        s.synchronize()
        gpu_us = self._samples(launch, i, 1, 5, host_us, 0.0)[0]
        return i + 5, gpu_us, host_us

    def _sample_to_budget(self, launch, i, gpu_us, host_us, best_us, budget_us, repeats,
                          drop_ratio, min_samples, max_samples) -> Timing:
        L = max(1, math.ceil(MIN_SAMPLE_US / max(gpu_us, 1e-3)))
        if repeats:
            R = int(repeats)
        else:
            R = int(budget_us / (L * max(gpu_us, host_us, 1e-3)))
            R = min(max(R, min_samples), max_samples)
        samples = self._samples(launch, i, min(R, EARLY_SAMPLES), L, host_us, gpu_us)
        i += len(samples) * L
        if best_us is not None and statistics.median(samples) > drop_ratio * best_us:
            return Timing(statistics.median(samples), samples, dropped=True)
        while len(samples) < R:
            k = min(CHUNK_SAMPLES, R - len(samples))
            samples += self._samples(launch, i, k, L, host_us, gpu_us)
            i += k * L
        return Timing(statistics.median(samples), samples)

    def _samples(self, launch, start, count, L, host_us, gpu_us) -> List[float]:
        cp, s = self.cp, self.stream
        # The GPU finishes launch j at spin + j * gpu_us and the CPU enqueues it
        # at j * host_us: the spin must cover the difference (plus margin).
        lag_us = count * L * max(0.0, host_us - gpu_us) + count * 10.0 + host_us
        spin_us = 1.5 * lag_us + 20.0
        self._spin((1,), (1,), (np.int64(spin_us * self.clock_khz / 1e3),))
        events = [cp.cuda.Event() for _ in range(count + 1)]
        events[0].record(s)
        j = start
        t0 = time.perf_counter()
        for k in range(count):
            for _ in range(L):
                launch(j)
                j += 1
            events[k + 1].record(s)
        if count * L >= 4:      # (a lone launch may carry first-call costs)
            self.host_us = (time.perf_counter() - t0) / (count * L) * 1e6
        events[-1].synchronize()
        return [cp.cuda.get_elapsed_time(events[k], events[k + 1]) * 1e3 / L for k in range(count)]

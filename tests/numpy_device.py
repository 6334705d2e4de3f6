"""A GPU workbench on numpy, for the CPU tests of what runs on it (the
workbench itself, the bench's opgen rows and graph mode): NumpySession is a
runtime.workbench.Session whose "device" arrays are numpy arrays, its
kernels the numpy reference (spoilt on request), its timer a fixed time,
its CUDA graphs a replay of the captured function."""
import contextlib

import numpy as np

from opgen.codegen import numerics as nx
from opgen.codegen.reference import reference_matmul_f32
from opgen.codegen.tolerance import tolerance
from opgen.runtime import workbench
from opgen.runtime.timing import Timing

FAKE_US = 7.5


class NumpyKernel:
    """A kernel stand-in computing the full reference of whatever (tiled)
    problem it is given, then spoiling it as asked."""

    def __init__(self, spec, fault=None):
        self.spec, self.fault = spec, fault

    def __call__(self, a, tensors, out, a_scale=None, bias=None, stream=None):
        ref = np.asarray(reference_matmul_f32(self.spec, a, tensors, a_scale=a_scale, bias=bias),
                         dtype=np.float32)
        if self.fault == "scale":            # 1.5x the tolerance: twice it would pass the bench
            ref = ref * (1 + 1.5 * tolerance(self.spec))
        if self.fault == "half_k":           # loses one of two split-K slices (exactly half
            ref = ref * 0.5                  # of the sum: the data repeat along K)
        value = nx.to_storage(ref, self.spec.out.dtype)
        if self.fault == "last_tile":        # leaves the last 16 rows unwritten: whatever
            out[:-16] = value[:-16]          # the buffer held shows (the poison, if any)
        else:
            out[...] = value


class FakeTimer:
    """Timer's interface: three launches, then FAKE_US."""
    stream = contextlib.nullcontext()

    def measure(self, launch, best_us=None, **kw):
        for i in range(3):
            launch(i)
        return Timing(FAKE_US, [FAKE_US] * 3)

    rank = measure


class NumpyGraph:
    """Session.capture's graph: launch() runs what was captured again."""

    def __init__(self, enqueue):
        self.enqueue, self.launches = enqueue, 0

    def launch(self, stream=None):
        self.launches += 1
        self.enqueue()


class NumpySession(workbench.Session):
    """The Session's device interface on numpy, no GPU; kernel(spec, "faulty")
    spoils its output as `fault` says."""
    xp = np
    arch = "sm_90"                              # (graph mode's PDL variant runs here)
    base_limit = 256
    l2 = 1 << 20
    stream = contextlib.nullcontext()

    def __init__(self, fault=None):             # (no cupy, no Timer)
        self.fault, self.released = fault, 0
        self.timer = FakeTimer()
        self.kernels = {}

    def to_host(self, x):
        return np.asarray(x)

    def free_bytes(self):
        return 1 << 34

    def synchronize(self):
        pass

    def release(self):
        self.released += 1

    def kernel(self, spec, cfg):
        return NumpyKernel(spec, self.fault if cfg == "faulty" else None)

    def capture(self, enqueue):
        """As a CUDA stream capture: nothing runs until the graph is launched."""
        self.graphs = getattr(self, "graphs", []) + [NumpyGraph(enqueue)]
        return self.graphs[-1]

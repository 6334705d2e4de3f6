"""The GPU side of `opgen bench`: `Gpu` holds torch and cupy on the current
device with one timing.Timer for every measurement (the runtime workbench's
session shares it), and gathers what a run asks of the GPU: the environment,
the machine (machine.py), the peers (peers.py), opgen's rows
(opgen_rows.py) and compiling ahead (precompile.py).  torch and cupy are
imported when a Gpu is made, so importing this module needs neither."""
from __future__ import annotations

import sys
import time
from typing import Dict, List, Optional, Sequence

from .. import __version__
from ..codegen.errors import UserError
from ..runtime import device
from ..runtime.timing import Timer, n_copies
from ..runtime.workbench import Session
from . import machine, opgen_rows, peers, precompile
from .failures import short_error


class Gpu:
    """torch + cupy on the current device, one timing.Timer for every measurement."""

    def __init__(self, budget_ms: float, mem_cap: int, seed: int = 0):
        try:
            import torch
        except ImportError:
            raise UserError("opgen bench needs torch (with CUDA) for the peers") from None
        if not torch.cuda.is_available():
            raise UserError("opgen bench needs a CUDA GPU (torch.cuda.is_available() is False)")
        import cupy as cp
        self.torch, self.cp = torch, cp
        self.dev = torch.device("cuda", cp.cuda.runtime.getDevice())
        torch.cuda.set_device(self.dev)
        self.timer = Timer()
        self.tstream = torch.cuda.ExternalStream(self.timer.stream.ptr, device=self.dev)
        self.arch = device.current_arch()
        self.session = Session(self.arch, timer=self.timer)
        self.l2 = self.session.l2
        self.budget_ms = budget_ms
        self.mem_cap = mem_cap
        self.seed = seed
        self.read_time = machine.ReadTimes(self, device.sm_count())
        self.t0 = time.time()

    def log(self, text: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    def env(self) -> dict:
        torch, cp = self.torch, self.cp
        out = {"device": device.device_name(), "arch": self.arch,
               "sm_count": device.sm_count(), "torch": torch.__version__,
               "torch_cuda": torch.version.cuda, "cupy": cp.__version__, "opgen": __version__,
               "python": sys.version.split()[0], "l2_bytes": self.l2}
        for k, fn in (("nvrtc", device.nvrtc_version),
                      ("driver", lambda: cp.cuda.runtime.driverGetVersion()),
                      ("cuda_runtime", lambda: cp.cuda.runtime.runtimeGetVersion())):
            try:
                out[k] = fn()
            except Exception as e:     # informational only
                out[k] = f"unknown ({short_error(e, 80)})"
        try:
            out["memory_bytes"] = int(torch.cuda.get_device_properties(self.dev).total_memory)
        except Exception:
            pass
        return out

    # -- timing
    def measure(self, launch):
        """Timing of launch(i) on the timer's stream (torch ops go there too)."""
        torch = self.torch
        torch.cuda.synchronize(self.dev)
        with torch.cuda.stream(self.tstream):
            return self.timer.measure(launch, budget_us=self.budget_ms * 1e3)

    def mem_budget(self) -> int:
        """The most memory one problem's copies (or graph layers) may take."""
        free, _ = self.cp.cuda.runtime.memGetInfo()
        return min(self.mem_cap, free // 4)

    def n_copies(self, per_copy: int) -> int:
        return n_copies(per_copy, self.l2, self.mem_budget())

    def capture(self, enqueue):
        """enqueue() (torch work) run once on a side stream, as torch advises
        before capturing (cuBLAS handles and workspaces, the allocator), then
        captured into a torch.cuda.CUDAGraph; returns its replay (on the
        current stream: gpu.measure's).  thread_local: the precompile's
        threads may touch CUDA meanwhile."""
        torch = self.torch
        side = torch.cuda.Stream(device=self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):
            enqueue()
        torch.cuda.current_stream(self.dev).wait_stream(side)
        torch.cuda.synchronize(self.dev)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            enqueue()
        torch.cuda.synchronize(self.dev)
        return g.replay

    def free(self) -> None:
        self.torch.cuda.synchronize(self.dev)
        self.torch.cuda.empty_cache()
        self.cp.get_default_memory_pool().free_all_blocks()

    # -- what a run asks
    def start_precompile(self, specs, shapes, Ms, db, use_db: bool, workers: Optional[int],
                         pdl_Ms: Sequence[int] = ()):
        """pdl_Ms: the Ms whose kernels graph mode also runs with pdl."""
        jobs = precompile.compile_jobs(specs, shapes, Ms, db, use_db, self.arch, pdl_Ms)
        return precompile.start(jobs, self.arch, workers, self.log)

    def wait_precompile(self, handle, cancel: bool = False) -> None:
        if cancel:
            precompile.cancel(handle)
        else:
            precompile.wait(handle, self.log)

    def measure_machine(self) -> dict:
        return machine.measure_machine(self)

    def time_peers(self, names: Sequence[str], N: int, K: int, Ms: Sequence[int], *,
                   graph: bool) -> Dict[int, dict]:
        return peers.time_peers(self, names, N, K, Ms, graph=graph)

    def time_spec(self, spec, N: int, K: int, Ms: Sequence[int], db, use_db: bool,
                  verify: bool, *, graph: bool, pdl: bool = True) -> List[dict]:
        rows = opgen_rows.time_spec(self.session, spec, N, K, Ms, db=db, use_db=use_db,
                                    verify=verify, graph=graph, pdl=pdl, budget_ms=self.budget_ms,
                                    seed=self.seed, mem_cap=self.mem_cap, log=self.log)
        self.free()
        return rows

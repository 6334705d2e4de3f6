"""The GPU side of `opgen bench`: `_Gpu` (torch + cupy on the current device)
measures the machine (copy bandwidth, matmul ceilings), times the peers and
opgen's kernels (the result rows), and compiles the kernels ahead.  torch and
cupy are imported inside `_Gpu`, so importing this module needs neither."""
from __future__ import annotations

import os
import sys
import time
from typing import Dict, List, Optional, Sequence

from opgen.bench.roofline import _r, stored_shapes
from opgen.bench.verify import (BASE_LIMIT, _reference_weight, _tile_shape_ok, base_rows,
                                base_shape, check_rows, check_rows_of)

def _short(e: BaseException, n: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return first[:n]


class _Gpu:
    """torch + cupy on the current device, one timing.Timer for every measurement."""

    def __init__(self, budget_ms: float, mem_cap: int, seed: int = 0):
        from opgen.codegen.errors import UserError
        try:
            import torch
        except ImportError:
            raise UserError("opgen bench needs torch (with CUDA) for the peers") from None
        if not torch.cuda.is_available():
            raise UserError("opgen bench needs a CUDA GPU (torch.cuda.is_available() is False)")
        import cupy as cp
        from opgen.runtime.timing import Timer
        self.torch, self.cp = torch, cp
        self.dev = torch.device("cuda", cp.cuda.runtime.getDevice())
        torch.cuda.set_device(self.dev)
        self.timer = Timer()
        self.tstream = torch.cuda.ExternalStream(self.timer.stream.ptr, device=self.dev)
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        self.l2 = int(props.get("l2CacheSize", 0)) or (60 << 20)
        self.budget_us = budget_ms * 1e3
        self.mem_cap = mem_cap
        self.seed = seed
        self.n_done = 0
        self._read_cache: Dict[int, Optional[float]] = {}     # read_time, per 16-byte words
        self._read_kernel = None                                # its kernel, compiled once
        self.t0 = time.time()

    def log(self, text: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    def env(self) -> dict:
        torch, cp = self.torch, self.cp
        from opgen import __version__
        from opgen.runtime import device
        out = {"device": device.device_name(), "arch": device.current_arch(),
               "sm_count": device.sm_count(), "torch": torch.__version__,
               "torch_cuda": torch.version.cuda, "cupy": cp.__version__, "opgen": __version__,
               "python": sys.version.split()[0], "l2_bytes": self.l2}
        for k, fn in (("nvrtc", device.nvrtc_version),
                      ("driver", lambda: cp.cuda.runtime.driverGetVersion()),
                      ("cuda_runtime", lambda: cp.cuda.runtime.runtimeGetVersion())):
            try:
                out[k] = fn()
            except Exception as e:     # informational only
                out[k] = f"unknown ({_short(e, 80)})"
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
            t = self.timer.measure(launch, budget_us=self.budget_us)
        return t

    def n_copies(self, per_copy: int) -> int:
        from opgen.runtime.timing import n_copies
        free, _ = self.cp.cuda.runtime.memGetInfo()
        return n_copies(per_copy, self.l2, min(self.mem_cap, free // 4))

    def free(self) -> None:
        self.torch.cuda.synchronize(self.dev)
        self.torch.cuda.empty_cache()
        self.cp.get_default_memory_pool().free_all_blocks()

    # -- compile ahead, in parallel
    def _compile_jobs(self, specs, shapes, Ms, db, use_db: bool) -> list:
        """(spec, config, arch) of every kernel opgen.load will pick: the DB
        record of the bucket, else the planner's heuristic, as MatmulOp
        chooses (config None: the quantize kernel).  A miss only means that
        kernel compiles later, serially."""
        from opgen.codegen import planner
        from opgen.codegen.buckets import bucket_of, representative_M
        from opgen.runtime.device import current_arch
        arch = current_arch()
        jobs = {}
        for spec in specs:
            for N, K in shapes:
                key = None
                if use_db and db is not None:
                    try:
                        from opgen.runtime.tuning_db import make_key
                        key = make_key(spec, N, K, arch=arch)
                    except Exception:
                        key = None
                for label in dict.fromkeys(bucket_of(M) for M in Ms):
                    cfg = None
                    if key is not None:
                        try:
                            rec = db.lookup(key, label)
                            if rec is not None:
                                cfg = planner.Config.from_dict(rec["config"])
                        except Exception:
                            cfg = None
                    if cfg is None:
                        try:
                            cfg = planner.heuristic(spec, arch, representative_M(label), N, K)
                        except Exception:
                            continue
                    jobs[spec, cfg] = None
            if spec.a.scale == "row":      # the quantize kernel of opgen's fused linear
                q = quantize_spec_for(spec)
                if q is not None:
                    jobs[q, None] = None
        return [(spec, cfg, arch) for spec, cfg in jobs]

    def start_precompile(self, specs, shapes, Ms, db, use_db: bool, workers: Optional[int]):
        """Start compiling with compiler.compile_many (worker processes: NVRTC
        is single-threaded CPU work), driven from a background thread, and
        return at once: the caller times the machine and the peers meanwhile,
        then calls wait_precompile.  One core is left to the timing loop.
        Returns a handle (None when nothing is left to wait for)."""
        import threading
        from opgen.codegen.compiler import compile_many
        jobs = self._compile_jobs(specs, shapes, Ms, db, use_db)
        if not jobs:
            return None
        n_cpu = os.cpu_count() or 1
        workers = max(1, min(workers or max(1, n_cpu - 1), len(jobs)))
        self.log(f"compiling {len(jobs)} kernels ({workers} processes)")
        if workers == 1:
            failed = sum(why is not None for _, why in compile_many(jobs, 1))
            self.log(f"compiled ({failed} failed; those rows will say why)")
            return None
        state = {"done": 0, "failed": 0}
        stop = threading.Event()

        def drain():
            try:
                for _, why in compile_many(jobs, workers):
                    state["done"] += 1
                    state["failed"] += why is not None
                    if stop.is_set():  # cancelled: closing compile_many ends its pool
                        break
            except Exception:          # the pool itself failed: the rest counts as failed
                pass

        thread = threading.Thread(target=drain, name="opgen-precompile", daemon=True)
        thread.start()
        return thread, stop, state, len(jobs), time.time()

    def wait_precompile(self, handle, cancel: bool = False) -> None:
        if handle is None:
            return
        thread, stop, state, n, t0 = handle
        if cancel:
            stop.set()
            return
        thread.join()
        failed = state["failed"] + n - state["done"]
        self.log(f"compiled {n} kernels in {time.time() - t0:.1f} s "
                 f"({failed} failed; those rows will say why)")

    # -- the machine
    def measure_machine(self) -> dict:
        """Copy bandwidth (TB/s, bytes read + written) and the dense matmul
        ceilings at 8192^3 (TFLOP/s, TOP/s), each measured here; a failure is
        recorded as KEY_error and that ceiling left out."""
        out: dict = {}
        for key, fn in (("copy", self._copy_bandwidth), ("fp16", self._peak_fp16),
                        ("int8", self._peak_int8), ("fp8", self._peak_fp8)):
            try:
                out.update(fn())
            except Exception as e:
                out[f"{key}_error"] = _short(e)
            self.free()
        self.log("machine: " + ", ".join(f"{k}={v}" for k, v in out.items()))
        return out

    _COPY_BYTES = 1 << 30
    _PEAK_S = 8192

    def _copy_bandwidth(self) -> dict:
        """1 GiB device to device, as a memcpy and as an elementwise kernel; the faster."""
        torch, nbytes = self.torch, self._COPY_BYTES
        src = torch.empty(nbytes, dtype=torch.uint8, device=self.dev).random_(0, 255)
        dst = torch.empty_like(src)
        t_cp = self.measure(lambda i: dst.copy_(src)).median_us
        s32, d32 = src.view(torch.float32), dst.view(torch.float32)
        t_k = self.measure(lambda i: torch.neg(s32, out=d32)).median_us
        out = {"copy_bytes": 2 * nbytes, "copy_memcpy_tbps": round(2 * nbytes / t_cp / 1e6, 4),
               "copy_kernel_tbps": round(2 * nbytes / t_k / 1e6, 4)}
        out["copy_tbps"] = max(out["copy_memcpy_tbps"], out["copy_kernel_tbps"])
        return out

    def _peak_fp16(self) -> dict:
        torch, S = self.torch, self._PEAK_S
        a = torch.randn(S, S, dtype=torch.float16, device=self.dev)
        b = torch.randn(S, S, dtype=torch.float16, device=self.dev)
        c = torch.empty(S, S, dtype=torch.float16, device=self.dev)
        t = self.measure(lambda i: torch.mm(a, b.t(), out=c)).median_us
        return {"fp16_tflops": round(2 * S ** 3 / t / 1e6, 2)}

    def _peak_int8(self) -> dict:
        torch, S = self.torch, self._PEAK_S
        a = torch.randint(-127, 128, (S, S), dtype=torch.int8, device=self.dev)
        b = torch.randint(-127, 128, (S, S), dtype=torch.int8, device=self.dev)
        t = self.measure(lambda i: torch._int_mm(a, b.t())).median_us
        return {"int8_tops": round(2 * S ** 3 / t / 1e6, 2)}

    def _peak_fp8(self) -> dict:
        torch, S = self.torch, self._PEAK_S
        f8 = torch.float8_e4m3fn
        a = torch.randn(S, S, dtype=torch.float16, device=self.dev).to(f8)
        b = torch.randn(S, S, dtype=torch.float16, device=self.dev).to(f8)
        sa = torch.ones(S, 1, dtype=torch.float32, device=self.dev)
        sb = torch.ones(1, S, dtype=torch.float32, device=self.dev)
        t = self.measure(lambda i: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb,
                                                    out_dtype=torch.bfloat16)).median_us
        return {"fp8_tflops": round(2 * S ** 3 / t / 1e6, 2)}

    # -- the read-only floor of memory-bound rows
    _READ_SRC = r"""
extern "C" __global__ void opgen_read(const uint4* __restrict__ p, long long n, unsigned* sink) {
  // Reads n 16-byte words once, 8 loads in flight per thread, streamed past L1
  // (ld.global.nc.L1::no_allocate.v4, as the GEMV's weight loads), and keeps
  // their XOR alive: the yardstick for kernels that must read those bytes.
  unsigned x = 0u;
  const long long stride = (long long)gridDim.x * blockDim.x * 8;
  for (long long base = (long long)blockIdx.x * blockDim.x * 8 + threadIdx.x; base < n; base += stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const long long j = base + (long long)u * blockDim.x;
      v[u] = make_uint4(0u, 0u, 0u, 0u);
      if (j < n)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + j));
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (x == 0x5EED1234u) sink[0] = x;
}
"""
    # (blocks per SM, threads per block) tried; the fastest counts
    _READ_LAUNCHES = ((2, 512), (4, 256), (8, 256))

    def read_time(self, nbytes: int) -> Optional[float]:
        """Median µs of a kernel that only reads `nbytes` (rotating copies, as
        every other row): what a memory-bound row can reach under this timer,
        launch and ramp-up included, as opposed to the byte floor (bytes / copy
        bandwidth of 1 GiB).  Cached per size; None if it cannot run."""
        cache = self._read_cache
        words = -(-nbytes // 16)
        if words in cache:
            return cache[words]
        cp, us = self.cp, None
        try:
            from opgen.runtime import device
            if self._read_kernel is None:
                self._read_kernel = cp.RawKernel(self._READ_SRC, "opgen_read")
            kern = self._read_kernel
            n = self.n_copies(words * 16)
            bufs = [cp.random.randint(0, 2 ** 31, size=words * 4, dtype=cp.int32) for _ in range(n)]
            sink = cp.zeros(1, cp.uint32)
            cp.cuda.runtime.deviceSynchronize()
            for per_sm, threads in self._READ_LAUNCHES:
                grid = (device.sm_count() * per_sm,)

                def launch(i, grid=grid, threads=threads):
                    kern(grid, (threads,), (bufs[i % n], cp.int64(words), sink), stream=self.timer.stream)
                t = self.measure(launch).median_us
                us = t if us is None else min(us, t)
        except Exception as e:
            self.log(f"read-only kernel for {nbytes} bytes failed: {_short(e)}")
            us = None
        finally:
            bufs = None
            self.free()
        cache[words] = _r(us)
        return cache[words]

    # -- peers
    def _peer_defs(self, N: int, K: int):
        """name -> (make_weights() -> tuple, make_act(M) -> tuple, call(act, w))."""
        torch, dev = self.torch, self.dev
        f16, bf16, i8 = torch.float16, torch.bfloat16, torch.int8

        def randn(*shape, dtype):
            return torch.randn(*shape, dtype=torch.float16, device=dev).to(dtype)

        def randi8(*shape):
            return torch.randint(-127, 128, shape, dtype=i8, device=dev)

        def tinygemm_w():
            codes = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)
            packed = torch._convert_weight_to_int4pack(codes, 8)
            sz = torch.randn(K // 128, N, 2, dtype=bf16, device=dev)
            return packed, sz

        def bminf(act, w):
            a, = act
            w8, ws = w
            s = a.abs().amax(dim=1, keepdim=True).float().clamp_(min=1e-8) / 127.0
            q = torch.round(a.float() / s).clamp_(-127, 127).to(i8)
            acc = torch._int_mm(q, w8.t())
            return (acc.float() * s * ws).to(f16)

        f8 = getattr(torch, "float8_e4m3fn", None)
        return {
            "cublas_fp16": (lambda: (randn(N, K, dtype=f16),),
                            lambda M: (randn(M, K, dtype=f16), torch.empty(M, N, dtype=f16, device=dev)),
                            lambda act, w: torch.mm(act[0], w[0].t(), out=act[1])),
            "cublas_bf16": (lambda: (randn(N, K, dtype=bf16),),
                            lambda M: (randn(M, K, dtype=bf16), torch.empty(M, N, dtype=bf16, device=dev)),
                            lambda act, w: torch.mm(act[0], w[0].t(), out=act[1])),
            "tinygemm_int4": (tinygemm_w,
                              lambda M: (randn(M, K, dtype=bf16),),
                              lambda act, w: torch._weight_int4pack_mm(act[0], w[0], 128, w[1])),
            # torch._int_mm needs M > 16: a caller pads smaller batches to 17 rows.
            "int_mm": (lambda: (randi8(N, K),),
                       lambda M: (randi8(max(M, 17), K),),
                       lambda act, w: torch._int_mm(act[0], w[0].t())),
            "scaled_mm": (lambda: (randn(N, K, dtype=f8),
                                   torch.ones(1, N, dtype=torch.float32, device=dev)),
                          lambda M: (randn(M, K, dtype=f8),
                                     torch.ones(M, 1, dtype=torch.float32, device=dev)),
                          lambda act, w: torch._scaled_mm(act[0], w[0].t(), scale_a=act[1],
                                                          scale_b=w[1], out_dtype=bf16)),
            "bminf_w8a8": (lambda: (randi8(N, K),
                                    torch.rand(N, dtype=torch.float32, device=dev) / 64 + 1e-3),
                           lambda M: (randn(max(M, 17), K, dtype=f16),),   # as int_mm
                           bminf),
        }

    @staticmethod
    def _nbytes(ts) -> int:
        return sum(int(t.numel() * t.element_size()) for t in ts)

    def _rotating_time(self, make_w, make_act, call, Ms, on_result) -> None:
        """Time call(act_set, w_set) for each M, rotating weight and activation
        copies; on_result(M, us or None, error or None, n_copies)."""
        try:
            w0 = make_w()
        except Exception as e:
            for M in Ms:
                on_result(M, None, "weights: " + _short(e), 0)
            return
        w_sets = [w0]
        for M in Ms:
            try:
                act0 = make_act(M)
                n = self.n_copies(self._nbytes(w0) + self._nbytes(act0))
                while len(w_sets) < n:
                    w_sets.append(tuple(t.clone() for t in w0))
                acts = [act0] + [tuple(t.clone() for t in act0) for _ in range(n - 1)]
                call(acts[0], w_sets[0])              # raises here if unsupported
                self.torch.cuda.synchronize(self.dev)

                def launch(i, acts=acts, n=n):
                    call(acts[i % n], w_sets[i % n])
                t = self.measure(launch)
                on_result(M, t.median_us, None, n)
            except Exception as e:
                on_result(M, None, _short(e), 0)
            finally:
                launch = acts = act0 = None
        w_sets = w0 = None
        self.free()

    def time_peers(self, peers: Sequence[str], N: int, K: int, Ms: Sequence[int]) -> Dict[int, dict]:
        out = {M: {"N": N, "K": K, "M": M, "errors": {}} for M in Ms}
        defs = self._peer_defs(N, K)
        for name in peers:
            make_w, make_act, call = defs[name]

            def done(M, us, err, n, name=name):
                out[M][f"{name}_us"] = _r(us)
                if err:
                    out[M]["errors"][name] = err
                self.log(f"{N}x{K} M={M} {name}: " + (f"{us:.2f} us" if us is not None else err))
            self._rotating_time(make_w, make_act, call, Ms, done)
        return out

    # -- opgen
    def _to_torch(self, x):
        """numpy storage array -> torch CUDA tensor (bfloat16 bits -> bfloat16)."""
        import numpy as np
        torch = self.torch
        if x is None:
            return None
        x = np.ascontiguousarray(x)
        if x.dtype == np.uint16:
            return torch.from_numpy(x.view(np.int16)).to(self.dev).view(torch.bfloat16)
        return torch.from_numpy(x).to(self.dev)

    def _activation(self, spec, M0: int, K0: int, rng):
        """random_activation at M0 x K0, shared by the specs with the same
        activation type (fp8 quantization in numpy is slow)."""
        from opgen.codegen.reference import random_activation
        cache = self.__dict__.setdefault("_act_cache", {})
        key = (spec.a.dtype, spec.a.scale, M0, K0)
        if key not in cache:
            if len(cache) >= 16:
                cache.pop(next(iter(cache)))
            cache[key] = random_activation(spec, M0, K0, rng)
        return cache[key]

    def _tile(self, t, shape):
        if t is None:
            return None
        if tuple(t.shape) == tuple(shape):
            return t
        if not _tile_shape_ok(t.shape, shape):
            raise ValueError(f"cannot tile {tuple(t.shape)} to {tuple(shape)}")
        return t.repeat(*[b // s for s, b in zip(t.shape, shape)]).contiguous()

    def _first_and_time(self, call, act0, w_sets):
        """Rotating copies of act0 (its last item the output) and of the
        weights (w_sets, grown in place), then one launch on the timer's
        stream into a NaN-poisoned output (compiles/loads the kernel, and
        leaves act0's output for the check).  Returns (launch(i), copies)."""
        torch = self.torch
        per = self._nbytes(w_sets[0]) + self._nbytes([x for x in act0 if x is not None])
        n = self.n_copies(per)
        while len(w_sets) < n:
            w_sets.append(tuple(t.clone() for t in w_sets[0]))
        acts = [act0] + [tuple(None if x is None else x.clone() for x in act0) for _ in range(n - 1)]
        # the inputs were made on the default stream; the timer's stream is
        # non-blocking, so wait for them before the first launch
        torch.cuda.synchronize(self.dev)
        # compile/load + first launch, with torch's and cupy's current stream the
        # timer's (a kernel's split-K workspace is zeroed by cupy on first use)
        with torch.cuda.stream(self.tstream), self.timer.stream:
            act0[-1].fill_(float("nan"))
            call(act0, w_sets[0])
        torch.cuda.synchronize(self.dev)

        def launch(i):
            call(acts[i % n], w_sets[i % n])
        return launch, n

    def time_spec(self, spec, N: int, K: int, Ms: Sequence[int], db, use_db: bool,
                  verify: bool) -> List[dict]:
        """Rows for (spec, N, K, each M): opgen's matmul on quantized
        activations (opgen_us) and, for int8/fp8 activations, opgen's fused
        linear from fp16 activations (quantize + GEMM: opgen_linear_us)."""
        import numpy as np
        import opgen
        from opgen.codegen.reference import random_bias, random_weight_tensors
        from opgen.codegen.buckets import bucket_of
        torch = self.torch
        rows = {M: {"spec": spec.name, "N": N, "K": K, "M": M, "opgen_us": None} for M in Ms}
        N0, K0 = base_shape(spec, N, K, getattr(self, "base_limit", BASE_LIMIT))
        rng = np.random.default_rng([self.seed, N, K, sum(map(ord, spec.name))])
        try:
            op = opgen.load(spec, N=N, K=K, db=db, use_db=use_db)
            host_w = random_weight_tensors(spec, N0, K0, rng)
            want = stored_shapes(spec, N, K)
            w0 = {k: self._tile(self._to_torch(v), want[k]) for k, v in host_w.items()}
            bias = host_bias = None
            if spec.epilogue.bias:
                host_bias = random_bias(spec, N0, rng)
                bias = self._tile(self._to_torch(host_bias), (N,))
        except Exception as e:
            for r in rows.values():
                r["error"] = "setup: " + _short(e)
            self.log(f"{spec.name} {N}x{K}: setup failed: {rows[Ms[0]]['error']}")
            return list(rows.values())
        lin = lin_error = None
        if spec.a.scale == "row":
            try:
                from opgen.runtime.op import load_linear
                lin = load_linear(spec, N, K, input_dtype="float16", db=db, use_db=use_db)
            except Exception as e:
                lin_error = _short(e)
        w_ref = None
        out_dt = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                  "float32": torch.float32}[spec.out.dtype]
        names = list(w0)
        w_sets = [tuple(w0[k] for k in names)]

        def check(got_t, a_rows, s_rows, rows_idx):
            nonlocal w_ref
            if w_ref is None:
                w_ref = _reference_weight(spec, host_w, N0, K0)
            got = got_t[list(map(int, rows_idx))].float().cpu().numpy()
            return check_rows(spec, a_rows, s_rows, w_ref, host_bias, got, N, K, N0, K0)

        for M in Ms:
            r = rows[M]
            r["base_shape"] = [N0, K0]
            M0 = base_rows(M)
            rows_idx = check_rows_of(M)
            launch = None
            try:
                a_host, s_host = self._activation(spec, M0, K0, rng)
                a = self._tile(self._to_torch(a_host), (M, K))
                a_scale = self._tile(self._to_torch(s_host), (M,))
                out = torch.empty(M, N, dtype=out_dt, device=self.dev)

                def call(act, w):
                    t = dict(zip(names, w))
                    op(act[0], t["qweight"], t.get("scales"), t.get("zeros"), bias=bias,
                       a_scale=act[1], out=act[2])
                launch, n = self._first_and_time(call, (a, a_scale, out), w_sets)
                r["config"] = op.kernel_for(M).config.name
                r["bucket"] = bucket_of(M)
                r["source"] = op.sources.get(r["bucket"])
                if verify:
                    r.update(check(out, np.asarray(a_host)[rows_idx % M0],
                                   None if s_host is None else np.asarray(s_host)[rows_idx % M0],
                                   rows_idx))
                t = self.measure(launch)
                r["opgen_us"] = _r(t.median_us)
                r["samples"] = len(t.samples)
                r["copies"] = n
                self.log(f"{spec.name} {N}x{K} M={M}: {t.median_us:.2f} us "
                         f"({r['config']}, {r['source']})"
                         + ("" if r.get("verified") is not False else "  OUTPUT WRONG"))
            except Exception as e:
                r["error"] = _short(e)
                self.log(f"{spec.name} {N}x{K} M={M}: failed: {r['error']}")
            finally:
                launch = a = a_scale = out = None
            if lin_error is not None:
                r["opgen_linear_error"] = lin_error
            elif lin is not None:
                try:
                    from opgen.codegen.reference import quantize_activation
                    x_host = self.__dict__.setdefault("_x_cache", {}).get((M0, K0))
                    if x_host is None:
                        x_host = rng.standard_normal((M0, K0)).astype(np.float16)
                        self._x_cache[(M0, K0)] = x_host
                    x = self._tile(self._to_torch(x_host), (M, K))
                    out = torch.empty(M, N, dtype=out_dt, device=self.dev)

                    def lcall(act, w):
                        t = dict(zip(names, w))
                        lin(act[0], t["qweight"], t.get("scales"), t.get("zeros"), bias=bias,
                            out=act[1])
                    launch, _ = self._first_and_time(lcall, (x, out), w_sets)
                    if verify:
                        # each row quantized over K0 = over K: the tiled row has the same absmax
                        codes, sc = quantize_activation(spec, x_host[rows_idx % M0])
                        chk = check(out, codes, sc, rows_idx)
                        r["linear_verified"] = chk["verified"]
                        r["linear_rel_err"] = chk.get("rel_err")
                    t = self.measure(launch)
                    r["opgen_linear_us"] = _r(t.median_us)
                    self.log(f"{spec.name} {N}x{K} M={M}: linear (quantize + GEMM) "
                             f"{t.median_us:.2f} us"
                             + ("" if r.get("linear_verified") is not False else "  OUTPUT WRONG"))
                except Exception as e:
                    r["opgen_linear_error"] = _short(e)
                    self.log(f"{spec.name} {N}x{K} M={M}: linear failed: {r['opgen_linear_error']}")
                finally:
                    launch = x = out = None
        w_sets = w0 = None
        self.free()
        return [rows[M] for M in Ms]


def quantize_spec_for(spec, input_dtype: str = "float16"):
    """The op-quantize spec runtime.op.QuantizedLinearOp builds for `spec`
    (for compiling it ahead; None if that cannot be built here)."""
    try:
        from opgen.codegen.spec import Activation, Output, Spec
        return Spec(name=f"quantize_{spec.a.dtype}_{input_dtype}", op="quantize",
                    a=Activation(input_dtype), b=None, out=Output(spec.a.dtype))
    except Exception:
        return None

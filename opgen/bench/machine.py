"""The machine `opgen bench` runs on, measured in the same run: copy
bandwidth and the dense matmul ceilings (the floors' denominators), and the
time of a kernel that only reads a row's bytes (what a memory-bound row can
reach under this timer).  `gpu` is runner.Gpu (torch and cupy)."""
from __future__ import annotations

from typing import Optional

from .failures import short_error
from .roofline import _r

COPY_BYTES = 1 << 30
PEAK_S = 8192                   # the ceilings' matmul: PEAK_S^3


def measure_machine(gpu, copy_bytes: int = COPY_BYTES, peak_s: int = PEAK_S) -> dict:
    """Copy bandwidth (TB/s, bytes read + written) and the dense matmul
    ceilings at peak_s^3 (TFLOP/s, TOP/s), each measured here; a failure is
    recorded as KEY_error and that ceiling left out."""
    out: dict = {}
    for key, fn in (("copy", lambda: _copy_bandwidth(gpu, copy_bytes)),
                    ("fp16", lambda: _peak_fp16(gpu, peak_s)),
                    ("int8", lambda: _peak_int8(gpu, peak_s)),
                    ("fp8", lambda: _peak_fp8(gpu, peak_s))):
        try:
            out.update(fn())
        except Exception as e:
            out[f"{key}_error"] = short_error(e)
        gpu.free()
    gpu.log("machine: " + ", ".join(f"{k}={v}" for k, v in out.items()))
    return out


def _copy_bandwidth(gpu, nbytes: int) -> dict:
    """nbytes device to device, as a memcpy and as an elementwise kernel; the faster."""
    torch = gpu.torch
    src = torch.empty(nbytes, dtype=torch.uint8, device=gpu.dev).random_(0, 255)
    dst = torch.empty_like(src)
    t_cp = gpu.measure(lambda i: dst.copy_(src)).median_us
    s32, d32 = src.view(torch.float32), dst.view(torch.float32)
    t_k = gpu.measure(lambda i: torch.neg(s32, out=d32)).median_us
    out = {"copy_bytes": 2 * nbytes, "copy_memcpy_tbps": round(2 * nbytes / t_cp / 1e6, 4),
           "copy_kernel_tbps": round(2 * nbytes / t_k / 1e6, 4)}
    out["copy_tbps"] = max(out["copy_memcpy_tbps"], out["copy_kernel_tbps"])
    return out


def _peak_fp16(gpu, S: int) -> dict:
    torch = gpu.torch
    a = torch.randn(S, S, dtype=torch.float16, device=gpu.dev)
    b = torch.randn(S, S, dtype=torch.float16, device=gpu.dev)
    c = torch.empty(S, S, dtype=torch.float16, device=gpu.dev)
    t = gpu.measure(lambda i: torch.mm(a, b.t(), out=c)).median_us
    return {"fp16_tflops": round(2 * S ** 3 / t / 1e6, 2)}


def _peak_int8(gpu, S: int) -> dict:
    torch = gpu.torch
    a = torch.randint(-127, 128, (S, S), dtype=torch.int8, device=gpu.dev)
    b = torch.randint(-127, 128, (S, S), dtype=torch.int8, device=gpu.dev)
    t = gpu.measure(lambda i: torch._int_mm(a, b.t())).median_us
    return {"int8_tops": round(2 * S ** 3 / t / 1e6, 2)}


def _peak_fp8(gpu, S: int) -> dict:
    torch = gpu.torch
    f8 = torch.float8_e4m3fn
    a = torch.randn(S, S, dtype=torch.float16, device=gpu.dev).to(f8)
    b = torch.randn(S, S, dtype=torch.float16, device=gpu.dev).to(f8)
    sa = torch.ones(S, 1, dtype=torch.float32, device=gpu.dev)
    sb = torch.ones(1, S, dtype=torch.float32, device=gpu.dev)
    t = gpu.measure(lambda i: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb,
                                               out_dtype=torch.bfloat16)).median_us
    return {"fp8_tflops": round(2 * S ** 3 / t / 1e6, 2)}


# --- the read-only floor of memory-bound rows -----------------------------------------

READ_SRC = r"""
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
READ_LAUNCHES = ((2, 512), (4, 256), (8, 256))


class ReadTimes:
    """read_time(nbytes): median µs of a kernel that only reads `nbytes`
    (rotating copies, as every other row), launch and ramp-up included, as
    opposed to the byte floor (bytes / copy bandwidth of 1 GiB).  Cached per
    size in 16-byte words; None if it cannot run."""

    def __init__(self, gpu, sm_count: int):
        self.gpu, self.sm_count = gpu, sm_count
        self.cache = {}
        self.kernel = None                 # compiled once

    def __call__(self, nbytes: int) -> Optional[float]:
        gpu, cp = self.gpu, self.gpu.cp
        words = -(-nbytes // 16)
        if words in self.cache:
            return self.cache[words]
        us = bufs = None
        try:
            if self.kernel is None:
                self.kernel = cp.RawKernel(READ_SRC, "opgen_read")
            kern = self.kernel
            n = gpu.n_copies(words * 16)
            bufs = [cp.random.randint(0, 2 ** 31, size=words * 4, dtype=cp.int32) for _ in range(n)]
            sink = cp.zeros(1, cp.uint32)
            cp.cuda.runtime.deviceSynchronize()
            for per_sm, threads in READ_LAUNCHES:
                grid = (self.sm_count * per_sm,)

                def launch(i, grid=grid, threads=threads):
                    kern(grid, (threads,), (bufs[i % n], cp.int64(words), sink),
                         stream=gpu.timer.stream)
                t = gpu.measure(launch).median_us
                us = t if us is None else min(us, t)
        except Exception as e:
            gpu.log(f"read-only kernel for {nbytes} bytes failed: {short_error(e)}")
            us = None
        finally:
            bufs = None
            gpu.free()
        self.cache[words] = _r(us)
        return self.cache[words]

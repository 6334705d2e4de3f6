"""A compiled kernel loaded on the GPU, and its launch.

Kernel(spec, config, arch) compiles (or takes from the cubin cache), loads the
module and launches on raw device pointers; `opgen.runtime.op` wraps it with
array checking and per-call dispatch. Kernel(..., pdl=True): the kernels
rendered and launched for programmatic dependent launch (runtime/pdl.py).
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..codegen import planner
from ..codegen.spec import Spec
from ..codegen import compiler
from ..codegen.kernel_args import ARGUMENTS, TMA_ARGUMENTS
from ..codegen.lower import DTYPE_BYTES
from . import pdl as pdl_launch, tma
from .device import current_arch, current_device


def load_function(compiled: compiler.Compiled):
    """cubin -> (module, function), with the dynamic shared memory opted in
    (NoGPUError, not a raw CUDA error, where there is no GPU)."""
    import cupy
    current_device()
    module = cupy.cuda.function.Module()
    module.load(compiled.cubin)
    fn = module.get_function(compiled.name)
    smem = compiled.plan.smem             # the most any launch of it takes
    if smem > 0:
        # cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8).
        # Needed whenever static + dynamic shared memory passes 48 KiB: the
        # default dynamic limit is 48 KiB minus the static part (codebook,
        # split-K flag), so a 48 KiB request fails without it.
        cupy.cuda.driver.funcSetAttribute(fn.ptr, 8, smem)
    return module, fn


# Dense [N, K] weights of predecode configs, one tensor per (device, stream)
# shared by every kernel (grown to the largest layer): a model's layers run one
# after another on a stream, so one scratch tensor serves them all.
_SCRATCH: dict = {}


def _scratch(nbytes: int, stream_ptr: int):
    import cupy
    key = (cupy.cuda.runtime.getDevice(), stream_ptr)
    buf = _SCRATCH.get(key)
    if buf is None or buf.size < nbytes:
        buf = _SCRATCH[key] = cupy.empty(nbytes, np.uint8)
    return buf


def _converters(args, pointer, integer) -> tuple:
    """(name, converter) of each argument in the kernels' order
    (codegen/kernel_args.py), decided once rather than per launch: ints as
    `integer`, pointers as `pointer`, the rest (the TMA tensor maps) as they
    are."""
    return tuple((a.name, integer if a.ctype == "int" else pointer if a.ctype.endswith("*")
                  else (lambda x: x)) for a in args)


_PLAIN_ARGS = _converters(ARGUMENTS, np.uint64, np.int32)
_PLAIN_ARGS_C = _converters(ARGUMENTS, ctypes.c_uint64, ctypes.c_int32)   # through the driver (pdl)
_TMA_ARGS = _converters(TMA_ARGUMENTS, ctypes.c_uint64, ctypes.c_int32)


def _values(converters: tuple, values: dict) -> list:
    """The launch's argument values in order; an absent or None pointer is null.
    (On every launch: one pass, no per-argument type test.)"""
    get = values.get
    return [conv(get(name) or 0) for name, conv in converters]


class Kernel:
    """One config's launch. A predecode config is two kernels: its dequant
    stage writes the dense weights into the shared scratch tensor, then the
    dense GEMM (this object's own function) reads them.

    pdl: every kernel rendered with pdl (codegen/render.py) and launched
    through runtime/pdl.py, so that it overlaps the previous kernel's tail
    on the stream; sm_90+. Off by default: it has not been measured on the
    GPU yet (docs/performance.md, open items)."""

    def __init__(self, spec: Spec, config: planner.Config, arch: str | None = None,
                 pdl: bool = False):
        self.spec, self.config, self.pdl = spec, config, pdl
        self.arch = arch or current_arch()
        *first, (gspec, gcfg) = planner.stages(spec, config)
        self.dequant = Kernel(*first[0], self.arch, pdl) if first else None
        # The dense weights' bytes per element, and whether the dense GEMM still
        # applies the scales (8-bit codes keep their channel / tensor scale).
        self._dense_bytes = DTYPE_BYTES[gspec.b.dtype] if first else 0
        self._dense_scaled = bool(first) and gspec.b.scale is not None
        self.gemm_config = gcfg
        self.compiled = compiler.compile_kernel(gspec, gcfg, self.arch, pdl=pdl)
        self.module, self.fn = load_function(self.compiled)
        self.plan = self.compiled.plan
        self._ws = {}     # (device, stream) -> (workspace, counters)
        self._grids = {}  # (M, N, K) -> (launch grid, dynamic shared memory)
        self._tma = tma.TmaMaps(self.plan.tma) if self.plan.tma else None

    def grid(self, M: int, N: int, K: int) -> tuple:
        return self._launch_shape(M, N, K)[0]

    def _launch_shape(self, M: int, N: int, K: int) -> tuple:
        # Cached: a dict hit is cheaper than evaluating the plan's rules per launch.
        g = self._grids.get((M, N, K))
        if g is None:
            if not planner.shape_ok(self.plan.consts, self.gemm_config, N, K):
                # (its tuning and the heuristic never pick it here: planner.candidates)
                raise ValueError(f"{self.spec.name}: config {self.config.name} does not run at "
                                 f"N={N}, K={K}; let the op choose, or pick one of "
                                 f"planner.candidates(spec, arch, M, N, K)")
            g = self._grids[(M, N, K)] = (self.plan.grid(M, N), self.plan.smem_at(K))
        return g

    def _workspace(self, M: int, N: int, grid: tuple, stream_ptr: int):
        """fp32 split-K workspace + tile counters; kernels leave both zeroed."""
        import cupy
        key = (cupy.cuda.runtime.getDevice(), stream_ptr)
        need_ws, need_cnt = M * N, grid[0] * grid[1]
        ws = self._ws.get(key)
        if ws is None or ws[0].size < need_ws or ws[1].size < need_cnt:
            ws = (cupy.zeros(max(need_ws, 1), np.float32), cupy.zeros(max(need_cnt, 1), np.int32))
            self._ws[key] = ws
        return ws

    def launch(self, ptrs: dict, M: int, N: int, K: int, stream=None) -> None:
        """ptrs: device addresses (ints) for a, a_scale, b, s, z, bias, out."""
        import cupy
        grid, smem = self._launch_shape(M, N, K)
        stream = stream or cupy.cuda.get_current_stream()
        if self.dequant is not None:
            dense = _scratch(N * K * self._dense_bytes, stream.ptr).data.ptr
            self.dequant.launch(dict(ptrs, out=dense), M, N, K, stream)
            ptrs = dict(ptrs, b=dense, s=ptrs["s"] if self._dense_scaled else 0, z=0)
        ws, cnt = (0, 0)
        if self.gemm_config.split_k > 1:
            w, c = self._workspace(M, N, grid, stream.ptr)
            ws, cnt = w.data.ptr, c.data.ptr
        if self._tma is not None:
            self._launch_tma(dict(ptrs, ws=ws, counters=cnt), M, N, K, grid, smem, stream)
            return
        values = {**ptrs, "ws": ws, "counters": cnt, "M": M, "N": N, "K": K}
        if self.pdl:
            self._launch_ex(grid, smem, stream.ptr, _values(_PLAIN_ARGS_C, values))
            return
        self.fn(grid, (self.plan.threads, 1, 1), tuple(_values(_PLAIN_ARGS, values)),
                shared_mem=smem, stream=stream)

    def _launch_tma(self, ptrs: dict, M: int, N: int, K: int, grid, smem: int, stream) -> None:
        maps = dict(tmA=self._tma.a(ptrs["a"], M, K), tmB=self._tma.b(ptrs["b"], N, K))
        args = _values(_TMA_ARGS, {**ptrs, **maps, "M": M, "N": N, "K": K})
        if self.pdl:
            self._launch_ex(grid, smem, stream.ptr, args)
            return
        tma.launch(self.fn, grid, self.plan.threads, smem, stream.ptr, args)

    def _launch_ex(self, grid, smem: int, stream_ptr: int, args: list) -> None:
        params = pdl_launch.kernel_params(args)      # (args and params live through the call)
        pdl_launch.launch_ex(self.fn.ptr, grid, (self.plan.threads, 1, 1), smem, stream_ptr,
                             ctypes.addressof(params))

    def __call__(self, a, tensors: dict, out, a_scale=None, bias=None, stream=None):
        """Launch on CuPy arrays (the tuner and tests use this directly)."""
        M, K = a.shape
        N = out.shape[1]
        ptrs = dict(a=a.data.ptr, b=tensors["qweight"].data.ptr, out=out.data.ptr,
                    s=tensors["scales"].data.ptr if "scales" in tensors else 0,
                    z=tensors["zeros"].data.ptr if "zeros" in tensors else 0,
                    a_scale=a_scale.data.ptr if a_scale is not None else 0,
                    bias=bias.data.ptr if bias is not None else 0)
        self.launch(ptrs, M, N, K, stream)


class QuantizeKernel:
    """op quantize: one block per row -> codes [M, K] + float32 scales [M]
    (pdl: Kernel's)."""

    def __init__(self, spec: Spec, arch: str | None = None, pdl: bool = False):
        self.spec, self.pdl = spec, pdl
        self.arch = arch or current_arch()
        self.compiled = compiler.compile_kernel(spec, None, self.arch, pdl=pdl)
        self.module, self.fn = load_function(self.compiled)

    def launch(self, x_ptr: int, codes_ptr: int, scale_ptr: int, M: int, K: int, stream) -> None:
        grid, block = self.compiled.plan.grid(M, 0), (self.compiled.plan.threads, 1, 1)
        if self.pdl:
            args = [ctypes.c_uint64(x_ptr), ctypes.c_uint64(codes_ptr), ctypes.c_uint64(scale_ptr),
                    ctypes.c_int32(M), ctypes.c_int32(K)]
            params = pdl_launch.kernel_params(args)
            pdl_launch.launch_ex(self.fn.ptr, grid, block, 0, stream.ptr, ctypes.addressof(params))
            return
        self.fn(grid, block,
                (np.uint64(x_ptr), np.uint64(codes_ptr), np.uint64(scale_ptr), np.int32(M), np.int32(K)),
                stream=stream)

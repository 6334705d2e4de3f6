"""TMA tensor maps (CUtensorMap) for the tma GEMM, and its launch.

CuPy binds neither cuTensorMapEncodeTiled nor by-value struct parameters of
this size, so the map is encoded through the driver library with ctypes and
the kernel is launched with cuLaunchKernel on a hand-built parameter array.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Dict, Tuple

from ..codegen.planner import TmaBoxes

# CUtensorMapDataType by element bytes (the GEMM only moves bits: fp16/bf16 as
# UINT16, int8/fp8 as UINT8), and the enum values of cuda.h.
_DTYPE = {1: 0, 2: 1, 4: 2}           # CU_TENSOR_MAP_DATA_TYPE_UINT8, _UINT16, _UINT32
_INTERLEAVE_NONE = 0
_SWIZZLE_NONE = 0                     # stored weight words, read back as plain rows
_SWIZZLE_128B = 3                     # matches wgmma_desc's 128-byte swizzle
_L2_PROMOTION_256B = 3
_OOB_FILL_ZEROS = 0                   # rows / columns past the tensor read as 0

TensorMap = ctypes.c_uint64 * 16      # 128 opaque bytes


class TmaError(RuntimeError):
    """The driver refused a tensor map (alignment, sizes, box)."""


@functools.lru_cache(maxsize=1)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    f = lib.cuTensorMapEncodeTiled
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.POINTER(TensorMap), ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                  ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                  ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                  ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return f


def encode_2d(ptr: int, rows: int, cols: int, elem_bytes: int, box_rows: int, box_cols: int,
              swizzle: int = _SWIZZLE_128B) -> TensorMap:
    """A row-major [rows, cols] tensor at device address ptr, read in boxes of
    box_rows x box_cols elements (128-byte swizzle: box_cols * elem_bytes = 128,
    one swizzle atom; none: any multiple of 16 bytes)."""
    m = TensorMap()
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(cols * elem_bytes)        # bytes between rows
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    step = (ctypes.c_uint32 * 2)(1, 1)
    rc = _driver()(ctypes.byref(m), _DTYPE[elem_bytes], 2, ctypes.c_void_p(ptr), dims, strides, box,
                   step, _INTERLEAVE_NONE, swizzle, _L2_PROMOTION_256B, _OOB_FILL_ZEROS)
    if rc != 0:
        raise TmaError(f"cuTensorMapEncodeTiled returned {rc} for a [{rows}, {cols}] x {elem_bytes}-byte "
                       f"tensor at 0x{ptr:x}, box {box_rows} x {box_cols}")
    return m


class TmaMaps:
    """The tensor maps of one kernel's launches, as its plan's boxes say
    (planner.TmaBoxes), by (address, rows, cols): a layer's weights keep
    theirs for good, activations get one per buffer (callers reuse buffers).
    Bounded."""

    LIMIT = 256

    def __init__(self, boxes: TmaBoxes):
        self.boxes = boxes
        self._maps: Dict[Tuple[int, ...], TensorMap] = {}

    def _get(self, ptr: int, rows: int, cols: int, elem_bytes: int, box_rows: int, box_cols: int,
             swizzle: int = _SWIZZLE_128B) -> TensorMap:
        key = (ptr, rows, cols, box_rows, box_cols)
        m = self._maps.get(key)
        if m is None:
            if len(self._maps) >= self.LIMIT:
                self._maps.clear()
            m = self._maps[key] = encode_2d(ptr, rows, cols, elem_bytes, box_rows, box_cols, swizzle)
        return m

    def a(self, ptr: int, M: int, K: int) -> TensorMap:
        """The activations [M, K]."""
        return self._get(ptr, M, K, self.boxes.elem_bytes, *self.boxes.box_a)

    def b(self, ptr: int, N: int, K: int) -> TensorMap:
        """The weights: dense [N, K], or the stored words of decoded ones."""
        bx = self.boxes
        if bx.stored is not None:
            rows, rowb = bx.stored.storage(N, K)
            return self._get(ptr, rows, rowb // bx.b_elem_bytes, bx.b_elem_bytes, *bx.box_b, _SWIZZLE_NONE)
        return self._get(ptr, N, K, bx.elem_bytes, *bx.box_b)


def launch(fn, grid, threads: int, smem: int, stream_ptr: int, args: list) -> None:
    """cuLaunchKernel with kernelParams built from ctypes values (the
    driver copies each parameter by the kernel's own layout)."""
    from cupy.cuda import driver
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    driver.launchKernel(fn.ptr, grid[0], grid[1], grid[2], threads, 1, 1, smem, stream_ptr,
                        ctypes.addressof(params), 0)

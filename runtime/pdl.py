"""Programmatic dependent launch (sm_90+): a kernel launched through the
driver's cuLaunchKernelEx with the programmatic-stream-serialization
attribute (CuPy's launcher sets no launch attributes), by ctypes.

Such a launch may start while the previous kernel on its stream still runs,
once every block of that kernel has executed griddepcontrol.launch_dependents
(templates/pdl.cuh) or exited; the kernel then waits (griddepcontrol.wait)
before it reads what that kernel wrote or writes anything. Behind a kernel
that never signals (one that is not opgen's) it starts when that kernel ends,
as a plain launch does; inside a captured CUDA graph the driver records the
same dependency as a programmatic edge. Kernel(pdl=True) launches this way;
off by default until measured on the GPU (docs/performance.md, open items).
"""
from __future__ import annotations

import ctypes
import functools

# cuda.h: CUlaunchAttributeID's CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class PdlLaunchError(RuntimeError):
    """cuLaunchKernelEx refused the launch."""


class LaunchAttributeValue(ctypes.Union):
    """CUlaunchAttributeValue: a 64-byte union (8-aligned: it holds pointers);
    only the member this launch sets is named."""
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_uint64),
                ("programmaticStreamSerializationAllowed", ctypes.c_uint)]


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: the id (a 4-byte enum), padded to 8, then the value."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=1)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p]
    lib.cuGetErrorName.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def kernel_params(args: list):
    """The kernelParams array of ctypes argument values (the driver copies
    each by the kernel's own layout); the values must outlive the launch call."""
    return (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])


def launch_ex(fn_ptr: int, grid, block, smem: int, stream_ptr: int, kernel_params_ptr: int,
              driver=None) -> None:
    """Launch function fn_ptr (a CUfunction) with programmatic stream
    serialization allowed. driver: what has cuLaunchKernelEx and
    cuGetErrorName (libcuda; tests pass a fake)."""
    drv = driver if driver is not None else _driver()
    attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value.programmaticStreamSerializationAllowed = 1
    cfg = LaunchConfig(*grid, *block, smem, stream_ptr, ctypes.pointer(attr), 1)
    rc = drv.cuLaunchKernelEx(ctypes.pointer(cfg), fn_ptr, kernel_params_ptr, None)
    if rc != 0:
        name = ctypes.c_char_p()
        known = drv.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value
        raise PdlLaunchError(f"cuLaunchKernelEx (programmatic dependent launch) failed: "
                             f"{name.value.decode() if known else 'CUresult'} ({rc}); "
                             f"grid {tuple(grid)}, block {tuple(block)}, {smem} bytes shared memory")

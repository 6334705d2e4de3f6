"""runtime/pdl.py on the CPU: the structs match cuda.h's layout, and
launch_ex hands a fake driver the launch it asked for (grid, block, shared
memory, stream, one attribute: programmatic stream serialization = 1, the
kernelParams pointer); a refused launch raises, naming the driver's error.
(The real launch: tests/runtime/test_kernel.py, on the GPU.)"""
import ctypes

import pytest

from opgen.runtime import pdl
from pdl_fakes import FakeDriver


def test_struct_layouts_match_cuda_h():
    """CUlaunchAttribute: 4-byte id padded to 8, 64-byte value; CUlaunchConfig:
    seven 4-byte fields, then the stream and the attributes 8-aligned."""
    assert ctypes.sizeof(pdl.LaunchAttributeValue) == 64
    assert ctypes.alignment(pdl.LaunchAttributeValue) == 8
    assert (pdl.LaunchAttribute.value.offset, ctypes.sizeof(pdl.LaunchAttribute)) == (8, 72)
    assert [getattr(pdl.LaunchConfig, f).offset for f in ("sharedMemBytes", "hStream", "attrs", "numAttrs")] \
        == [24, 32, 40, 48]
    assert ctypes.sizeof(pdl.LaunchConfig) == 56
    assert pdl.PROGRAMMATIC_STREAM_SERIALIZATION == 6


def test_launch_ex_passes_the_launch_and_the_attribute():
    drv = FakeDriver()
    args = [ctypes.c_uint64(0xABC), ctypes.c_int32(7)]
    params = pdl.kernel_params(args)
    pdl.launch_ex(0x1234, (3, 2, 1), (128, 1, 1), 4096, 0x5678, ctypes.addressof(params), driver=drv)
    (call,) = drv.calls
    assert call == dict(grid=(3, 2, 1), block=(128, 1, 1), smem=4096, stream=0x5678, fn=0x1234,
                        params=ctypes.addressof(params), extra=None, attrs=[(6, 1)])
    # kernelParams: the address of each argument value, in order
    assert list(params) == [ctypes.addressof(a) for a in args]


def test_a_refused_launch_raises_with_the_driver_s_error_name():
    drv = FakeDriver(rc=1)
    with pytest.raises(pdl.PdlLaunchError, match=r"CUDA_ERROR_INVALID_VALUE \(1\).*grid \(1, 1, 1\)"):
        pdl.launch_ex(1, (1, 1, 1), (32, 1, 1), 0, 0, 0, driver=drv)

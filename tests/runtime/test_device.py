"""What GPU we are on (runtime/device.py): without one, a clear NoGPUError;
with one, an arch the planner knows."""
import pytest

from opgen.codegen import hw
from opgen.runtime import device


def test_no_gpu_says_so():
    if device.has_gpu():
        pytest.skip("a GPU is present")
    with pytest.raises(device.NoGPUError, match="CuPy is not installed|no usable CUDA GPU"):
        device.current_arch()


@pytest.mark.gpu
def test_the_gpu_is_described():
    assert device.current_arch() in hw.ARCHS
    assert device.device_name() and device.sm_count() > 0
    assert device.nvrtc_version().count(".") == 1

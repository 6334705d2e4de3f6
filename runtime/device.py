"""What GPU we are on (arch string, name), asked of CuPy once."""
from __future__ import annotations

import functools
from typing import Optional

from ..codegen import hw
from ..codegen.compiler import nvrtc_version  # noqa: F401 (part of what a device reports)


def has_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


class NoGPUError(RuntimeError):
    """No usable CUDA device (or no CuPy): building works, running does not."""


@functools.lru_cache(maxsize=None)
def _props(dev: int) -> dict:
    import cupy
    return cupy.cuda.runtime.getDeviceProperties(dev)


def current_device() -> int:
    try:
        import cupy
        dev = cupy.cuda.runtime.getDevice()
        _props(dev)
        return dev
    except ImportError:
        raise NoGPUError("CuPy is not installed: pip install 'opgen[cuda12]' (or [cuda13])") from None
    except Exception as e:   # CUDARuntimeError: no driver, no device
        raise NoGPUError(f"no usable CUDA GPU ({e}); `opgen build` still works without one") from None


def current_arch() -> str:
    p = _props(current_device())
    return hw.arch_from_cc(p["major"], p["minor"]).name


def device_name() -> str:
    n = _props(current_device())["name"]
    return n.decode() if isinstance(n, bytes) else str(n)


def sm_count() -> int:
    return int(_props(current_device())["multiProcessorCount"])


def planning_sms() -> Optional[int]:
    """The SM count the planner sizes grids for: this GPU's, or None without
    one (the planner then takes the arch's planned device, codegen/hw.py)."""
    return sm_count() if has_gpu() else None

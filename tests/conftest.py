"""Shared test setup: the `gpu` marker skips cleanly without a GPU, and GPU
checks can record what they measured into a JSON results file
(OPGEN_RESULTS=path; under pytest-xdist one file per worker beside it) so
that a run on the GPU leaves evidence behind."""
import json
import os

import pytest

_records = []


def _has_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (CuPy found none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def record():
    """record(**fields): add one row to the GPU results file."""
    def add(**fields):
        _records.append(fields)
        _write(exitstatus=None)   # keep the file current: a killed run still leaves evidence
    return add


def pytest_sessionfinish(session, exitstatus):
    _write(exitstatus)


def _write(exitstatus):
    path = os.environ.get("OPGEN_RESULTS")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if path and worker:              # pytest -n: a file per worker (RESULTS.gw0.json, ...)
        root, ext = os.path.splitext(path)
        path = f"{root}.{worker}{ext}"
    if path and _records:
        info = {}
        try:
            from opgen.runtime import device
            info = {"device": device.device_name(), "arch": device.current_arch(),
                    "nvrtc": device.nvrtc_version()}
        except Exception:
            pass
        # whole or not at all: a run killed by its time limit keeps the last complete file
        with open(path + ".tmp", "w") as f:
            json.dump({"env": info, "exitstatus": exitstatus if exitstatus is None else int(exitstatus),
                       "checks": _records}, f, indent=1)
        os.replace(path + ".tmp", path)

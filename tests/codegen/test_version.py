"""opgen's version, stated once (codegen/version.py): what the package, its
metadata and `pyproject.toml` say, and a part of every cubin's cache key."""
import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest

import opgen
from opgen.codegen import compiler, planner
from opgen.codegen.resolve import as_spec
from opgen.codegen.version import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_a_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert opgen.__version__ == __version__


def test_pyproject_reads_it():
    tomllib = pytest.importorskip("tomllib")          # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    module, _, attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"].rpartition(".")
    assert getattr(importlib.import_module(module), attr) == __version__


def test_installed_metadata_agrees():
    try:
        installed = importlib.metadata.version("opgen")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("opgen is not installed")
    assert installed == __version__, "reinstall opgen (pip install -e .): its metadata is stale"


def test_version_keys_the_cubin_cache(monkeypatch):
    s = as_spec("w8a8_int8")
    cfg = planner.heuristic(s, "sm_90", 1, 4096, 4096)
    key = compiler.cache_key(s, cfg, "sm_90", "sm_90")
    monkeypatch.setattr(compiler, "__version__", __version__ + ".post1")
    assert compiler.cache_key(s, cfg, "sm_90", "sm_90") != key

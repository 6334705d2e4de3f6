"""The fingerprint of the code a config runs (codegen/source_hash.py): the
rendered CUDA less comments and layout, with each kernel's launch constants;
any change to what runs changes it, a comment or reformatting does not."""
import re

import pytest

from opgen.codegen import planner, render
from opgen.codegen.resolve import as_spec
from opgen.codegen.source_hash import config_source_hash, digest, normalize


def test_normalize_drops_only_comments_and_layout():
    a = "int x = a + b; // sum\n/* two\n lines */ f( x );"
    assert normalize(a) == normalize("int x=a+b;\nf(x);")
    assert normalize("int x = a - b;") != normalize("int x = a + b;")


def test_digest():
    assert re.fullmatch(r"[0-9a-f]{20}", digest("int x;"))
    assert digest("int  x ;  // a comment\n") == digest("int x;")
    assert digest("int x;") != digest("int y;")


def _edit(monkeypatch, edit, only=None):
    """Every kernel rendered with `edit` applied to its source (only: to
    kernels of that family)."""
    real = render.render

    def edited(spec, cfg, arch, *a, **k):
        src, g = real(spec, cfg, arch, *a, **k)
        return (edit(src) if only in (None, cfg.family) else src), g
    monkeypatch.setattr(render, "render", edited)


def test_the_hash_follows_what_runs(monkeypatch):
    s = as_spec("w4a16_sym_g128")
    a, b = planner.candidates(s, "sm_90", 16, 4096, 4096)[:2]
    h = config_source_hash(s, a, "sm_90")
    assert config_source_hash(s, a, "sm_90") == h and config_source_hash(s, b, "sm_90") != h
    assert config_source_hash(s, a, "sm_80") != h         # another arch's kernel
    _edit(monkeypatch, lambda src: "// reviewed\n" + src.replace(";", " ;"))
    assert config_source_hash(s, a, "sm_90") == h          # comments and layout: the same kernel
    _edit(monkeypatch, lambda src: src + "\n__device__ int changed;\n")
    assert config_source_hash(s, a, "sm_90") != h


def test_a_predecode_config_hashes_both_kernels(monkeypatch):
    s = as_spec("gptq_v2_w4a16_g128")
    cfg = next(c for c in planner.candidates(s, "sm_90", 4096, 4096, 4096) if c.predecode)
    h = config_source_hash(s, cfg, "sm_90")
    _edit(monkeypatch, lambda src: src + "\n__device__ int changed;\n", only="dequant")
    assert config_source_hash(s, cfg, "sm_90") != h


def test_a_config_that_cannot_run_raises():
    s = as_spec("w4a16_sym_g128")
    with pytest.raises(planner.PlanError):
        config_source_hash(s, planner.Config("gemm", 16, 64, 64, 16, 16, 2, wgmma=True), "sm_80")

"""bench/ablate.py on the CPU. Its variants are sets of probes, named hooks in
the templates (codegen/render.py PROBES): each probe must change the source
of the kernels that have it, and the probed kernels must still compile
(NVRTC needs no GPU); without probes a kernel renders as it ships (the
render snapshot's digest); a probe a kernel does not have is an error. Every
variant applies to the kernels it was written for and to no other."""
import importlib.util
import json
from pathlib import Path

import pytest

from opgen.codegen import compiler, planner, render

_TESTS = Path(__file__).resolve().parents[1]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ablate = _load("ablate", _TESTS.parent / "bench" / "ablate.py")
render_snapshot = _load("render_snapshot", _TESTS / "codegen" / "render_snapshot.py")

ARCH = "sm_90"
RS = ("w4a16_sym_g128", "gemm_16x64x128_w64x16_p12_s1_wg_tma_rs4", 16, 8192, 8192)
RS_GPTQ = ("gptq_v2_w4a16_g128_repacked", "gemm_256x64x64_w64x256_p4_s1_wg_tma_rs2", 256, 8192, 8192)
GEMV = ("w4a16_sym_g128", "gemv_m1_w4_c4_v16_s1", 1, 8192, 8192)
GEMV_PF = ("bnb_nf4", "gemv_m1_w8_c4_v16_s1_pf", 1, 8192, 8192)
GEMV_TC = ("w4a16_sym_g128", "gemv_m16_w4_v16_s4_tc", 16, 8192, 8192)   # a kind without probes
KINDS = {"gemm_rs": [RS, RS_GPTQ], "gemv_row": [GEMV, GEMV_PF]}   # kernels of the kinds with probes


def _render(entry, probes=frozenset()):
    spec, cfg = ablate._config(*entry, ARCH)
    return render.render(spec, cfg, ARCH, probes=probes)[0]


def test_probes_belong_to_kinds_that_exist():
    assert set(render.PROBES) <= set(render.TEMPLATES)
    for kind, entries in KINDS.items():
        for e in entries:
            spec, cfg = ablate._config(*e, ARCH)
            assert planner.plan(spec, cfg, ARCH).kind == kind
            assert render.kernel_probes(spec, cfg, ARCH) == render.PROBES[kind]


@pytest.mark.parametrize("kind,probe", sorted((k, p) for k, ps in render.PROBES.items() for p in ps))
def test_each_probe_changes_its_kernels(kind, probe):
    for e in KINDS[kind]:
        assert _render(e, frozenset({probe})) != _render(e), (probe, e[1])


def test_default_render_is_the_shipped_kernel():
    """No probes: the source the snapshot holds (comments and layout aside)."""
    snap = json.loads(render_snapshot.SNAPSHOT.read_text())
    for e in [RS, RS_GPTQ, GEMV]:
        src = _render(e)
        assert _render(e, frozenset()) == src
        assert snap[f"db|{e[0]}|{ARCH}|{e[1]}"]["kernels"][0]["hash"] == render_snapshot.digest(src)


def test_a_probe_the_kernel_lacks_is_an_error():
    with pytest.raises(ValueError, match="no probe nonesuch"):
        _render(RS, frozenset({"nonesuch"}))
    with pytest.raises(ValueError, match="the gemv_row kernel has no probe no_mma"):
        _render(GEMV, frozenset({"no_mma"}))
    with pytest.raises(ValueError, match="has no probe no_mac"):
        _render(GEMV_TC, frozenset({"no_mac"}))


# Together these take every probe once (no_lds and lds_quarter are two ways
# to replace the same loads, so they go apart); both GEMV loop forms.
COMPILED = [(RS, {"no_a", "no_w", "no_decode", "no_mma", "spin"}),
            (RS, {"w_l2", "no_scales", "lds_quarter"}),
            (RS_GPTQ, {"no_lds"}),
            (GEMV, {"no_mac", "no_stage"}),
            (GEMV_PF, {"no_mac", "no_stage"})]


def test_compiled_probes_take_every_probe():
    for kind, probes in render.PROBES.items():
        taken = set().union(*(p for e, p in COMPILED if e in KINDS[kind]))
        assert taken == probes, kind


@pytest.mark.parametrize("entry,probes", COMPILED, ids=[f"{e[1]}-{'+'.join(sorted(p))}" for e, p in COMPILED])
def test_probed_kernels_compile(entry, probes):
    spec, cfg = ablate._config(*entry, ARCH)
    src, _ = render.render(spec, cfg, ARCH, probes=frozenset(probes))
    cubin, _ = compiler.nvrtc_compile(src, render.kernel_name(spec, cfg), planner.plan(spec, cfg, ARCH).target)
    assert len(cubin) > 1000


@pytest.mark.parametrize("variant", sorted(ablate.VARIANTS))
def test_every_variant_applies_where_it_is_meant_to(variant):
    if variant == "as_is":
        targets, others = [RS, GEMV, GEMV_TC], []
    elif variant.startswith("gemv_"):
        targets, others = [GEMV, GEMV_PF], [RS, GEMV_TC]
    else:
        targets, others = [RS, RS_GPTQ], [GEMV, GEMV_TC]
    for t in targets:
        assert ablate._applies(variant, *ablate._config(*t, ARCH), ARCH), (variant, t[1])
    for t in others:
        assert not ablate._applies(variant, *ablate._config(*t, ARCH), ARCH), (variant, t[1])


def test_use_variant_renders_with_its_probes(tmp_path, monkeypatch):
    monkeypatch.setattr(render, "render", render.render)      # undone after the test
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    spec, cfg = ablate._config(*RS, ARCH)
    ablate._use_variant("no_mma", str(tmp_path))
    assert render.render(spec, cfg, ARCH)[0] == _render(RS, frozenset({"no_mma"}))
    assert "if (M < 0) wgmma_rs(acc, frag[ks], " in render.render(spec, cfg, ARCH)[0]

"""Rendering a kernel's CUDA (codegen/render.py): every kind's template
renders for a shipped spec to one kernel with the expected name and no
template text left, from the launch plan it returns; op quantize's kernel;
probes a kind does not have are refused; with pdl, each kind's kernel
signals its dependents first, prefetches its weights into L2 and waits
before it reads the activations.
(The probes' effects:
tests/bench/test_ablate.py; the shipped sources unchanged:
test_render_snapshot.py.)"""
import re
from dataclasses import replace
from importlib import resources

import pytest

from opgen.codegen import planner, render
from opgen.codegen.resolve import as_spec
from kernel_kinds import MATMUL_KINDS, one_of_each_kind

LEFTOVER = re.compile(r"\{\{|\}\}|\{%[-+ ]|[-+ ]%\}|\{#")     # (asm operands are "{%0, %1}")


def kernels(src: str) -> list:
    return re.findall(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\(', src)


def test_every_kernel_template_is_a_kind():
    templates = resources.files("opgen.templates")
    assert all(templates.joinpath(t).is_file() for t in render.TEMPLATES.values())
    kernel_templates = {p.name for p in templates.iterdir() if p.name.endswith(".cu.j2")}
    assert kernel_templates == set(render.TEMPLATES.values())        # one kernel per template
    assert set(render.PROBES) <= set(render.TEMPLATES)


def test_one_of_each_kind_is_found():
    assert set(one_of_each_kind()) == set(MATMUL_KINDS)


@pytest.mark.parametrize("kind", MATMUL_KINDS)
def test_every_kind_renders(kind):
    s, cfg, arch = one_of_each_kind()[kind]
    plan = planner.plan(s, cfg, arch)
    assert render.TEMPLATES[plan.kind] and plan.kind == kind
    src, consts = render.render(s, cfg, arch)
    assert kernels(src) == [render.kernel_name(s, cfg)] == [f"opgen_{s.name}_{cfg.name}"]
    assert src.count("__global__") == 1
    assert not LEFTOVER.search(src), LEFTOVER.search(src).group(0)
    assert consts == plan.consts
    # the plan given is the plan used (build and the runtime pass theirs)
    assert render.render(s, cfg, arch, plan=plan) == (src, consts)


@pytest.mark.parametrize("name,code_t,qmax", [("quantize_int8_row", "int8_t", "127.0"),
                                              ("quantize_fp8_row", "uint8_t", "448.0")])
def test_quantize_renders(name, code_t, qmax):
    s = as_spec(name)
    src, info = render.render_quantize(s, "sm_90", planner.QUANTIZE_THREADS)
    assert kernels(src) == [f"opgen_{name}"]
    assert info == {"name": f"opgen_{name}", "threads": planner.QUANTIZE_THREADS, "smem": 0}
    assert f"{code_t}* __restrict__ codes" in src and qmax in src
    assert not LEFTOVER.search(src)


@pytest.mark.parametrize("kind", MATMUL_KINDS)
def test_probes_of_a_kind(kind):
    """A kernel has its kind's probes; any other probe is refused, naming it
    and what the kind has."""
    s, cfg, arch = one_of_each_kind()[kind]
    have = render.PROBES.get(kind, frozenset())
    assert render.kernel_probes(s, cfg, arch) == have
    with pytest.raises(ValueError, match=rf"the {kind} kernel has no probe no_such_probe \(it has: "
                                         rf"{', '.join(sorted(have)) or 'none'}\)"):
        render.render(s, cfg, arch, probes=frozenset({"no_such_probe"}))
    for probe in sorted(have)[:1]:                      # one of its own renders
        probed, _ = render.render(s, cfg, arch, probes=frozenset({probe}))
        assert probed != render.render(s, cfg, arch)[0]


def test_widened_rs_gemm_has_no_probes():
    """The rs GEMM's int8 path (codes widened for int8 activations) has none
    of the 16-bit path's probe hooks: none are offered, and each is refused
    rather than rendering the unprobed kernel."""
    s = planner.execution_spec(as_spec("w4a8_int8"), "sm_90")
    cfg = planner.Config("gemm", 64, 128, 128, 64, 64, 4, 1, wgmma=True, tma=True, rs=True)
    assert render.kernel_probes(s, cfg, "sm_90") == frozenset()
    with pytest.raises(ValueError, match=r"has no probe no_mma \(it has: none\)"):
        render.render(s, cfg, "sm_90", probes=frozenset({"no_mma"}))


@pytest.mark.parametrize("name,raw", [("bnb_nf4", "float"), ("mxfp4", "uint8_t"), ("w4a16_sym_g128", None)])
def test_rs_gemm_converts_group_scales_where_it_uses_them(name, raw):
    """Group scales stored in another type than the compute type (NF4's
    fp32, MXFP4's e8m0) stay in the rs GEMM's slots as loaded and are
    converted when a unit takes them, two units later: not beside the
    load, where the conversion would wait for it. fp16 scales are loaded as
    they are."""
    s = as_spec(name)
    cfg = planner.heuristic(s, "sm_90", 16, 8192, 8192)
    assert cfg.rs
    src = render.render(s, cfg, "sm_90")[0]
    body = src[src.index("__global__"):]
    if raw is None:
        assert "scale_raw_t" not in src and "cT fa[2]" in body
        return
    assert f"typedef {raw} scale_raw_t;" in src and "load_scale_ct(" not in body
    unit = body[body.index("auto unit = "):]
    if name != "mxfp4":
        assert "scale_raw_t fa[2]" in body
        assert unit.index("sa[j] = scale_pair(fa_u[j]);") < unit.index("fa_u[j] = load_scale_raw(")
        return
    # MXFP4: a row's scales of a k-tile (bytes) in one word, one load and one slot register
    assert cfg.BK == 64 and "uint32_t fa[2], fb[2];" in body
    assert "reinterpret_cast<const uint16_t*>(S) + scale_index(n, k, N, K) / 2" in src
    assert unit.index("sa[j] = scale_word_pair(fa_u, j);") < unit.index("fa_u = load_scale_word(")
    deep = render.render(s, replace(cfg, BK=128), "sm_90")[0]
    assert "reinterpret_cast<const uint32_t*>(S) + scale_index(n, k, N, K) / 4" in deep


# The first place each kind reads the previous kernel's output (activations)
# or writes: the kernel's pdl_wait() must come before it.
FIRST_DEPENDENT = {
    "gemm": "load_stage(smem, s,", "gemv_row": "stage_activations(a,", "gemv_int8": "stage_activations(A,", "gemv_tc": "stage_activations(a,",
    "gemv_col": "load_act(a,", "gemm_tma": "tma_load_2d(st, &tmA", "gemm_rs": "&tmA,",
    "dequant": "*reinterpret_cast<uint4*>(dst", "quantize": "ldg16(row",
}
PDL_PTX = ("griddepcontrol.wait;", "griddepcontrol.launch_dependents;")


def check_pdl(src: str, kind: str) -> None:
    """src, rendered with pdl: both instructions once (templates/pdl.cuh), the
    kernel signals its dependents first and waits before it reads the
    activations."""
    assert [src.count(p) for p in PDL_PTX] == [1, 1]
    body = src[src.index("__global__"):]
    assert body.count("pdl_launch_dependents();") == 1
    assert body.index("pdl_launch_dependents();") < body.index("pdl_wait();") < body.index(FIRST_DEPENDENT[kind])


def pdl_cases():
    """Every kind, the row GEMV with its other prefetch, and the TMA GEMM with dense operands."""
    cases = dict(one_of_each_kind())
    s, cfg, arch = cases["gemv_row"]
    cases["gemv_row/prefetch"] = (s, replace(cfg, prefetch=not cfg.prefetch), arch)
    fp16 = as_spec("fp16")
    cases["gemm_tma/dense"] = (fp16, next(c for c in planner.candidates(fp16, "sm_90", 256, 4096, 4096)
                                          if c.tma and c.cluster > 1), "sm_90")
    return cases


@pytest.mark.parametrize("case", sorted(pdl_cases()))
def test_pdl_renders_the_wait_and_the_early_signal(case):
    s, cfg, arch = pdl_cases()[case]
    src, consts = render.render(s, cfg, arch, pdl=True)
    plain, plain_consts = render.render(s, cfg, arch)
    check_pdl(src, case.split("/")[0])
    assert consts == plain_consts and not any(p in plain for p in PDL_PTX)
    assert kernels(src) == kernels(plain)


PDL_PREFETCHES = ("pdl_prefetch_block(", "prefetch_l2_box(", "pdl_prefetch_params(")


@pytest.mark.parametrize("case", sorted(pdl_cases()))
def test_pdl_prefetches_the_weights_before_the_wait(case):
    """Decoded weights, their scales and zero points go to L2 before the
    wait (templates/pdl.cuh); dense weights (maybe a predecode config's
    dequant output) do not."""
    s, cfg, arch = pdl_cases()[case]
    src, _ = render.render(s, cfg, arch, pdl=True)
    body = src[src.index("__global__"):]
    calls = [body.index(c) for c in PDL_PREFETCHES if c in body]
    if case == "gemm_tma/dense":
        assert not calls
    else:
        assert calls and min(calls) < body.index("pdl_wait();")


def test_pdl_quantize_and_its_arch():
    s = as_spec("quantize_int8_row")
    src, _ = render.render_quantize(s, "sm_90", planner.QUANTIZE_THREADS, pdl=True)
    check_pdl(src, "quantize")
    assert not any(p in render.render_quantize(s, "sm_90", planner.QUANTIZE_THREADS)[0] for p in PDL_PTX)
    spec, cfg, _ = one_of_each_kind()["gemm"]
    with pytest.raises(ValueError, match="griddepcontrol needs sm_90"):
        render.render(spec, cfg, "sm_89", pdl=True)
    with pytest.raises(ValueError, match="griddepcontrol needs sm_90"):
        render.render_quantize(s, "sm_80", pdl=True)
    assert render.pdl_available("sm_90")
    assert not render.pdl_available("sm_89") and not render.pdl_available("sm_80")

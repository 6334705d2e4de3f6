"""Rendering a kernel's CUDA (codegen/render.py): every kind's template
renders for a shipped spec to one kernel with the expected name and no
template text left, from the launch plan it returns; op quantize's kernel;
probes a kind does not have are refused. (The probes' effects:
tests/bench/test_ablate.py; the shipped sources unchanged:
test_render_snapshot.py.)"""
import re
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

"""The matmul kernels' argument list, declared once (codegen/kernel_args.py):
every rendered kernel's signature is the declared list, plan.json lists it,
the TMA kernels take their two tensor maps in place of a and b, and the
emitted parameter list keeps the templates' 100-column layout. (The
launcher's values in this order: tests/runtime/test_kernel.py.)"""
import json
import re

import pytest

from opgen.codegen import planner, render
from opgen.codegen.build import build_spec
from opgen.codegen.kernel_args import ARGUMENTS, TMA_ARGUMENTS, Arg, kernel_params
from opgen.codegen.resolve import as_spec, shipped_specs
from kernel_kinds import MATMUL_KINDS, one_of_each_kind

MATMUL = sorted(n for n in shipped_specs() if as_spec(n).op == "matmul")


def signature(src: str, name: str) -> list:
    """The parameters of kernel `name` in a rendered source, whitespace folded."""
    assert src.count(f" {name}(") + src.count(f"\n{name}(") == 1, name
    params = re.search(rf"[\s]{re.escape(name)}\(([^)]*)\)", src).group(1)
    return [" ".join(p.split()) for p in params.split(",")]


def declared(s, cfg, arch) -> list:
    args = TMA_ARGUMENTS if planner.plan(s, cfg, arch).tma else ARGUMENTS
    return [a.declaration for a in args]


@pytest.mark.parametrize("kind", MATMUL_KINDS)
def test_every_kind_declares_the_list(kind):
    s, cfg, arch = one_of_each_kind()[kind]
    src, _ = render.render(s, cfg, arch)
    assert signature(src, render.kernel_name(s, cfg)) == declared(s, cfg, arch)


@pytest.mark.parametrize("name", MATMUL)
def test_every_pick_declares_the_list(name):
    """The heuristic's kernels of every shipped spec, each stage of them."""
    s0 = as_spec(name)
    for arch in ("sm_80", "sm_90"):
        for M in (1, 16, 256, 4096):
            for s, cfg in planner.stages(s0, planner.heuristic(s0, arch, M, 4096, 4096)):
                src, _ = render.render(s, cfg, arch)
                assert signature(src, render.kernel_name(s, cfg)) == declared(s, cfg, arch), cfg.name


def test_the_lists():
    names = [a.name for a in ARGUMENTS]
    assert names == ["a", "a_scale", "b", "s", "z", "bias", "out", "ws", "counters", "M", "N", "K"]
    assert [a.name for a in TMA_ARGUMENTS] == ["tmA", "tmB"] + [n for n in names if n not in ("a", "b")]
    assert all(a.ctype == "int" for a in ARGUMENTS if a.name in ("M", "N", "K"))
    assert all(a.ctype.endswith("*") for a in ARGUMENTS if a.name not in ("M", "N", "K"))


def test_declaration():
    """Pointers are __restrict__ (no two arguments alias); a kernel's own
    declaration, where it is not `ctype name`, is kept."""
    assert Arg("out", "void*", "").declaration == "void* __restrict__ out"
    assert Arg("a", "const void*", "", "const uint8_t* A").declaration == "const uint8_t* __restrict__ A"
    assert Arg("M", "int", "").declaration == "int M"
    tm = TMA_ARGUMENTS[0]
    assert tm.declaration == "const __grid_constant__ TmaDesc tmA"
    assert Arg("x", "float*", "doc").describe() == {"name": "x", "type": "float*", "doc": "doc"}


@pytest.mark.parametrize("args", [ARGUMENTS, TMA_ARGUMENTS])
def test_kernel_params_layout(args):
    """Wrapped at 100 columns after `{{ kernel_name }}(`, continuation lines
    indented 11 spaces, each declaration whole and in order."""
    text = kernel_params(args)
    lines = text.split("\n")
    assert len("{{ kernel_name }}(" + lines[0]) <= 100
    assert all(line.startswith(" " * 11) and len(line) <= 100 for line in lines[1:])
    assert [" ".join(p.split()) for p in text.split(",")] == [a.declaration for a in args]


def test_plan_json_lists_the_arguments(tmp_path):
    """plan.json's "arguments" are the declared list; a TMA launch lists
    its own (tensor maps first)."""
    build_spec(as_spec("fp16"), tmp_path, "sm_90", M=4096)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["arguments"] == [a.describe() for a in ARGUMENTS]
    (launch,) = plan["kernels"].values()
    assert "tma" in launch, launch["config"]
    assert launch["tma"]["arguments"] == [a.describe() for a in TMA_ARGUMENTS]

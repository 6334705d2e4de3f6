"""planner/quantize.py: op quantize's one launch shape -- a block of
QUANTIZE_THREADS per row of activations, no dynamic shared memory -- and the
kernel compiled and built with it."""
import json

import pytest

from opgen.codegen import compiler, planner
from opgen.codegen.build import build_spec
from opgen.codegen.resolve import as_spec


def test_quantize_plan():
    # op quantize: one block per row
    q = planner.quantize_plan("sm_90")
    assert q.grid(7, 0) == (7, 1, 1) and q.grid.text() == "[M, 1, 1]" and q.kind == "quantize"
    assert (q.threads, q.smem, q.smem_at(8192), q.tma) == (planner.QUANTIZE_THREADS, 0, 0, None)
    for arch in ("sm_80", "sm_86", "sm_89", "sm_90"):
        assert planner.quantize_plan(arch).target == arch       # no wgmma: the plain target


@pytest.mark.parametrize("name", ["quantize_int8_row", "quantize_fp8_row"])
def test_the_kernel_is_built_to_the_plan(name, tmp_path):
    """The compiled kernel takes the plan's block size, and plan.json says
    the plan's grid and block."""
    s = as_spec(name)
    c = compiler.compile_kernel(s, None, "sm_80")
    assert c.plan == planner.quantize_plan("sm_80")
    assert f"constexpr int THREADS = {planner.QUANTIZE_THREADS};" in c.source
    build_spec(s, tmp_path, "sm_80")
    (k,) = json.loads((tmp_path / "plan.json").read_text())["kernels"].values()
    assert k["block"] == [planner.QUANTIZE_THREADS, 1, 1] and k["grid"] == "[M, 1, 1]"

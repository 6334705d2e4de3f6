"""planner/registry.py: every family behind one entry point; the launch plan
of each valid config agrees with its geometry, and names a template."""
import dataclasses

import pytest

from opgen.codegen import planner
from opgen.codegen.render import TEMPLATES
from opgen.codegen.resolve import as_spec, load_spec, shipped_specs
from opgen.codegen.spec import Pack


def spec(name):
    return load_spec(shipped_specs()[name])


def test_family_of():
    C = planner.Config
    assert planner.family_of(C("gemv", tc=True)).name == "gemv"
    assert planner.family_of(planner.DEQUANT).name == "dequant"
    assert planner.family_of(C("gemm", wgmma=True, tma=True, rs=True)).name == "rs"
    assert planner.family_of(C("gemm", wgmma=True, tma=True, predecode=True)).name == "tma"
    assert planner.family_of(C("gemm", wgmma=True, raster=8)).name == "tma"    # (which refuses it)
    assert planner.family_of(C("gemm")).name == "gemm"
    assert set(planner.FAMILIES) == {"gemm", "tma", "rs", "gemv", "dequant"}


@pytest.mark.parametrize("name", ["w4a16_sym_g128", "awq_w4a16_g128", "fp8_e4m3_w8a8", "gptq_v2_w4a16_g128"])
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_plan_agrees_with_geometry(name, arch):
    s = spec(name)
    kinds = set()
    for cfg in planner.all_configs():
        try:
            g = planner.geometry(s, cfg, arch)
        except planner.PlanError:
            continue
        for st, c in planner.stages(s, cfg):
            p = planner.plan(st, c, arch)
            kinds.add(p.kind)
            assert p.kind in TEMPLATES and p.threads == p.consts["threads"]
            assert p.target == ("sm_90a" if c.wgmma else arch)
            assert bool(p.tma) == bool(c.tma)
        # the last stage's launch: what grid() and launch_smem() say of the config
        assert p.grid(300, 8192) == planner.grid(s, cfg, 300, 8192)
        assert p.smem_at(8032) == planner.launch_smem(g, cfg, 8032)
    assert kinds
    with pytest.raises(ValueError, match="several kernels"):
        planner.plan(s, planner.Config("gemm", 128, 128, 64, 64, 32, 4, 1, predecode=True), arch)


def test_codes_packed_in_planes_have_no_kernel_but_their_execution_spec_does():
    """planes (HF BitNet's rows i, i + N/4, ... in one byte): no kernel reads
    them; the execution spec packs the same codes along k, as it does the
    bytes BitNet's loader writes."""
    s = as_spec("bitnet_b158")
    hf = dataclasses.replace(s, name="hf", b=dataclasses.replace(s.b, pack=Pack("uint8", "n", (0, 1, 2, 3), True)))
    cfg = planner.heuristic(s, "sm_90", 16, 4096, 4096)
    with pytest.raises(planner.PlanError, match="no kernel reads codes packed in planes"):
        planner.geometry(hf, cfg, "sm_90")
    e = planner.execution_spec(hf, "sm_90")
    assert e.b.pack == planner.execution_spec(s, "sm_90").b.pack and planner.geometry(e, cfg, "sm_90")

"""`opgen build` in codegen (codegen/build.py): every shipped spec built for
every arch through NVRTC (no GPU needed), with its plan.json; the plan of a
dynamic M (one kernel per M bucket's pick, each written once); a shape the
spec or the kernels do not allow refused before anything is compiled or
written, a default size named as the default."""
import hashlib
import json
from types import SimpleNamespace

import pytest

from opgen.codegen import build, hw, planner
from opgen.codegen.buckets import LABELS, representative_M
from opgen.codegen.build import build_spec
from opgen.codegen.canonical import spec_to_yaml_dict
from opgen.codegen.compiler import default_config
from opgen.codegen.errors import UserError
from opgen.codegen.resolve import load_spec, shipped_specs
from opgen.codegen.validate import spec_from_dict

SPECS = sorted(shipped_specs())
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90"]


def spec(name):
    return load_spec(shipped_specs()[name])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", SPECS)
def test_build_every_spec(name, arch, tmp_path):
    s = spec(name)
    paths = build_spec(s, tmp_path, arch, M=16 if arch != "sm_90" else None)
    assert any(p.suffix == ".cu" for p in paths)
    assert any(p.suffix == ".cubin" and p.stat().st_size > 1000 for p in paths)
    assert (tmp_path / "plan.json").exists()
    # A TMA launch says how to build its tensor maps and which arguments it takes.
    plan = json.loads((tmp_path / "plan.json").read_text())
    for k in plan["kernels"].values():
        for launch in k.get("before", []) + [k]:
            c = launch.get("config", {})            # (quantize plans have none)
            assert bool(c.get("tma")) == ("tma" in launch)
            if "tma" in launch:
                t = launch["tma"]
                stored = t.get("b_swizzle") == "none"        # decoded weights' stored words
                # activations: one 128-byte swizzle atom of k per box (the runtime's maps)
                assert t["box_a"] == [c["BM"], min(c["BK"], 128 // t["elem_bytes"])]
                assert stored or t["box_b"] == [c["BN"] // c["cluster"], c["BK"]]
                assert [a["name"] for a in t["arguments"]][:2] == ["tmA", "tmB"]


def _compile_nothing(monkeypatch):
    """build's compiler stand-in: each stage's launch plan, a token source
    and cubin (the plan's structure without NVRTC's seconds)."""
    def compile_config(s, cfg, arch):
        return [SimpleNamespace(name=f"k_{c.name}", source=f"// {c.name}\n", cubin=b"\0" * 8,
                                plan=planner.plan(st, c, arch), resources={"spill_bytes": 0})
                for st, c in planner.stages(s, cfg)]
    monkeypatch.setattr(build, "compile_config", compile_config)


@pytest.mark.parametrize("name,arch", [("gptq_v2_w4a16_g128", "sm_90"), ("bnb_nf4", "sm_80"),
                                       ("w8a8_int8", "sm_90")])
def test_dynamic_M_plan(name, arch, tmp_path, monkeypatch):
    """Without M: the default pick (the heuristic's, passing over configs
    that spill: compiler.default_config) for each bucket's representative M
    on the arch's planned device, at the default N and K; each picked
    kernel written once (.cu and its target's .cubin), predecode's dequant
    first. (NF4's sm_80 M = 1 pick spills 16 bytes; its next one does not.)"""
    _compile_nothing(monkeypatch)
    s = spec(name)
    N = s.shape.N or build.DEFAULT_NK
    K = s.shape.K or build.DEFAULT_NK
    paths = build_spec(s, tmp_path, arch)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert (plan["spec"], plan["arch"], plan["N"], plan["K"]) == (name, arch, N, K)
    assert plan["spec_hash"] == s.content_hash()
    # the kernels are the execution spec's, and the plan says how to get there
    ks = planner.execution_spec(s, arch)
    ex = plan["execution"]
    assert (ex["spec"], ex["spec_hash"]) == (ks.name, ks.content_hash())
    assert ex["weight"]["layout"] == "nt" and set(ex["transcode"]) <= {"qweight", "scales", "zeros"}
    if name == "gptq_v2_w4a16_g128":
        assert ex["transcode"]["qweight"] == "transposed, fields reordered"
        assert ex["weight"]["pack"] == {"container": "int32", "axis": "k", "order": [0, 2, 4, 6, 1, 3, 5, 7]}
    else:
        assert ks is s and set(ex["transcode"].values()) == {"kept"}
    sms = hw.planned_device(arch).sms
    picks = {label: default_config(ks, arch, representative_M(label), N, K, sms) for label in LABELS}
    assert plan["dispatch"] == {label: cfg.name for label, cfg in picks.items()}
    assert set(plan["kernels"]) == set(plan["dispatch"].values())
    for cfg_name, k in plan["kernels"].items():
        for launch in k.get("before", []) + [k]:
            assert (tmp_path / launch["source"]).is_file() and (tmp_path / launch["cubin"]).is_file()
            assert launch["cubin"].endswith(f".{launch['target']}.cubin")
            cubin = (tmp_path / launch["cubin"]).read_bytes()
            assert launch["cubin_sha256"] == hashlib.sha256(cubin).hexdigest()
        assert [b["config"]["family"] for b in k.get("before", [])] in ([], ["dequant"])
    written = {p.name for p in paths}
    assert "plan.json" in written and len(written) == len(paths)     # nothing written twice


def test_a_shape_the_spec_refuses_is_a_user_error(tmp_path, monkeypatch):
    def compile_config(*a):
        raise AssertionError("compiled a shape the spec refuses")
    monkeypatch.setattr(build, "compile_config", compile_config)
    with pytest.raises(UserError, match=r"^gptq_v2_w4a16_g128: .*multiple of 32"):
        build_spec(spec("gptq_v2_w4a16_g128"), tmp_path, "sm_90", M=1, N=4096, K=4100)


def test_a_default_size_is_named_as_the_default(tmp_path, monkeypatch):
    """build made its plan at K = 4096 for a spec leaving K any and said
    "K=4096 must be a multiple of the scale group 3", a K the user never gave."""
    _compile_nothing(monkeypatch)
    d = spec_to_yaml_dict(spec("w8a8_int8"))
    d.update(a={"dtype": "float16"}, accumulate="float32",
             b={"dtype": "uint8", "scale": {"dtype": "float16", "group": 96}})
    s = spec_from_dict(d)
    with pytest.raises(UserError) as ei:
        build_spec(s, tmp_path / "out", "sm_90")
    assert str(ei.value) == (f"{s.name}: K=4096 must be a multiple of the scale group 96 (K=4096 is "
                             "the default: the spec leaves shape.K any; give --K or fix shape.K)")
    assert not (tmp_path / "out").exists()                  # refused before anything is written
    with pytest.raises(UserError) as ei:                    # a K given is not called a default
        build_spec(s, tmp_path / "out", "sm_90", K=4000)
    assert "default" not in str(ei.value)
    build_spec(s, tmp_path / "out", "sm_90", M=1, K=96 * 32)     # (refused no further)


@pytest.mark.parametrize("name,sizes,match", [
    ("quantize_int8_row", dict(K=12), "K=12 must be a positive multiple of 8"),
    ("quantize_int8_row", dict(K=2 ** 31), "K=2147483648 is out of range"),
    ("gptq_v2_w4a16_g128", dict(N=2 ** 31), "N=2147483648 is out of range .*32-bit int"),
    ("gptq_v2_w4a16_g128", dict(M=2 ** 64 + 1), "M=18446744073709551617 is out of range"),
])
def test_sizes_are_checked_for_every_op(name, sizes, match, tmp_path, monkeypatch):
    """`opgen build quantize_* --K` was not validated; sizes past the kernels'
    32-bit indexing built (exit 0)."""
    _compile_nothing(monkeypatch)
    monkeypatch.setattr(build, "compile_kernel", lambda *a: pytest.fail("compiled"))
    with pytest.raises(UserError, match=rf"^{name}: {match}"):
        build_spec(spec(name), tmp_path, "sm_90", **sizes)

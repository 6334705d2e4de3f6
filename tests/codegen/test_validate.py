"""Spec validation (codegen/validate.py): generated valid / broken specs,
specific messages, sizes fixed on the command line, what the kernels hold
(sizes, the shape rule of build, exact zero points), 8-bit activations with
sub-byte weights and the int32 output, whose example specs check accepts and
build refuses until their kernels exist (`opgen check`, `list` and `build`:
tests/package/test_cli_specs.py, test_cli_build.py)."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opgen.cli import main
from opgen.codegen import numerics as nx
from opgen.codegen import planner
from opgen.codegen import spec as S
from opgen.codegen.canonical import dump_yaml, spec_to_yaml_dict
from opgen.codegen.errors import SpecError, SpecErrors, UserError
from opgen.codegen.resolve import load_spec
from opgen.codegen.validate import (A8_DECODE_INTS, FLOAT_WEIGHT_DTYPES, SUB_BYTE_INT_DTYPES,
                                    spec_from_dict, specialize_shape, zero_range)
from a8_examples import A8_PATHS
from strategies import valid_spec_dicts

ERR_LINE = re.compile(r"^.+:\d+: [a-z_.0-9]+: .+$")
HYP = settings(max_examples=int(__import__("os").environ.get("OPGEN_HYP_N", "150")), deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _errors(fn, *args, **kw) -> SpecErrors:
    with pytest.raises(SpecErrors) as ei:
        fn(*args, **kw)
    return ei.value


# --- generated valid specs (strategies in tests/strategies.py) ---------------------

@HYP
@given(valid_spec_dicts())
def test_valid_specs_validate_and_round_trip(d):
    spec = spec_from_dict(d)
    hash(spec)                                              # frozen, tuples only
    assert spec.name == d["name"] and spec.op == d["op"]
    assert load_spec(dump_yaml(d)) == spec                  # the dict as a YAML file
    canon = spec_to_yaml_dict(spec)
    text = dump_yaml(canon, sort_keys=False)
    again = load_spec(text, filename="x.yaml")
    assert again == spec
    assert spec_to_yaml_dict(again) == canon
    assert again.content_hash() == spec.content_hash()
    if spec.b is not None:
        w = spec.b
        assert w.dtype == d["b"]["dtype"]
        if w.pack is not None:
            assert sorted(w.pack.order) == list(range(S.codes_per_container(w)))
            assert isinstance(w.pack.order, tuple)
        if w.codebook is not None:
            assert isinstance(w.codebook, tuple) and len(w.codebook) == 1 << w.bits


# --- generated broken specs -------------------------------------------------------------

def _get(d, path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _mappings(d, path=()):
    yield path
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _mappings(v, path + (k,))


def m_unknown_key(d, draw):
    mapping_paths = list(_mappings(d))
    p = draw(st.sampled_from(mapping_paths))
    _get(d, p)["bogus_key"] = 1
    return ".".join(p + ("bogus_key",))


BAD_VALUES = {
    ("opgen",): [2, "1", 0, True],
    ("name",): ["Has Space", "UPPER", 5, "", "dash-name", "a" * 65],
    ("op",): ["conv", 1, None],
    ("a", "dtype"): ["float64", "int4", 8],
    ("a", "scale"): ["col", 1],
    ("b", "dtype"): ["uint3", "fp32", ["uint4"]],
    ("b", "layout"): ["tn", "NT", 0],
    ("b", "pack", "container"): ["int16", "uint32", 32],
    ("b", "pack", "axis"): ["m", "K", None],
    ("b", "pack", "order"): ["abc", [0.5], "PDUP"],
    ("b", "scale", "dtype"): ["float64", "fp8"],
    ("b", "scale", "group"): ["abc", 0, -4, 1.5, True, "group"],
    ("b", "scale", "layout"): ["xy", "kk"],
    ("b", "zero", "kind"): ["maybe", "asym", 0],
    ("b", "zero", "offset"): [0.5, "one"],
    ("b", "zero", "value"): ["eight", 8.5],
    ("b", "formula"): ["q + z", "(q - z) / s", 3],
    ("b", "bits"): [0, 9, "four"],
    ("accumulate",): ["float64", "fp16", 32],
    ("out", "dtype"): ["int4", "float64", 16],
    ("epilogue", "bias"): [3, "yes", None],
    ("epilogue", "activation"): ["tanh", "ReLU", False],
    ("shape", "M"): [0, -3, "any", 2.5],
    ("shape", "N"): [0, "dynamic", "many"],
    ("shape", "K"): [0, "dynamic", -128],
}


def m_bad_value(d, draw):
    present = [p for p in BAD_VALUES if _get(d, p) is not None]
    p = draw(st.sampled_from(present))
    v = draw(st.sampled_from(BAD_VALUES[p]))
    if v == "PDUP":                       # a repeated entry: not a permutation
        v = [0] * len(_get(d, ("b", "pack", "order")))
    _get(d, p[:-1])[p[-1]] = v
    return ".".join(p)


REQUIRED = [("opgen",), ("name",), ("op",), ("a",), ("a", "dtype"), ("b", "dtype"),
            ("b", "pack", "container"), ("b", "pack", "axis"), ("b", "scale", "dtype"),
            ("b", "scale", "group"), ("b", "zero", "kind"), ("out", "dtype"),
            ("b", "bits"), ("b", "codebook")]


def m_missing(d, draw):
    present = [p for p in REQUIRED if _get(d, p) is not None]
    if d["op"] == "matmul":
        present.append(("b",))
    p = draw(st.sampled_from(present))
    del _get(d, p[:-1])[p[-1]]
    return ".".join(p)


def m_inconsistent(d, draw):
    """One rule-breaking change; returns the field path the error must name."""
    b = d.get("b")
    a = d["a"]
    cands = []
    if d["op"] == "quantize":
        cands += ["quant_b", "quant_bias", "quant_out", "quant_act"]
    else:
        cands += ["out_int8"]
    if a["dtype"] in ("float16", "bfloat16"):
        cands += ["a16_scale", "acc_int32"]
    if a["dtype"] == "int8":
        # (no scale: an int32 output, which takes none)
        cands += ["int8_acc", "int8_noscale" if "scale" in a else "int32_a_scale", "int8_wdtype"]
    if a["dtype"] == "float8_e4m3":
        cands += ["fp8_wdtype"]
    if b is not None:
        bits = b.get("bits") or S.WEIGHT_CODES[b["dtype"]].bits
        cands += ["e8m0_channel", "codebook_len" if b["dtype"] == "codebook" else "codebook_extra"]
        cands += ["drop_pack"] if bits < 8 else ["add_pack"]
        if b["dtype"] in FLOAT_WEIGHT_DTYPES or "scale" not in b:
            cands += ["zero_const"]
        if "pack" in b:
            cands += ["order_len"]
            if b["pack"]["axis"] == "k" and isinstance(_get(b, ("scale", "group")), int):
                cands += ["group_not_mult_p"]
        if isinstance(_get(b, ("scale", "group")), int) and _get(d, ("shape", "K")) not in (None, "any"):
            cands += ["group_not_div_k"]
        z = b.get("zero", {})
        if z.get("kind") == "int" and "pack" in z:
            cands += ["zero_unpacked"]
        if z.get("kind") == "const":
            cands += ["const_novalue"]
    c = draw(st.sampled_from(cands))
    if c == "quant_b":
        d["b"] = {"dtype": "float16"}
        return "b"
    if c == "quant_bias":
        d["epilogue"] = {"bias": True}
        return "epilogue.bias"
    if c == "quant_out":
        d["out"] = {"dtype": draw(st.sampled_from(S.OUT_DTYPES))}
        return "out.dtype"
    if c == "quant_act":
        d["a"] = {"dtype": "int8", "scale": "row"}
        return "a.dtype"
    if c == "out_int8":
        d["out"] = {"dtype": "int8"}
        return "out.dtype"
    if c == "a16_scale":
        a["scale"] = "row"
        return "a.scale"
    if c == "acc_int32":
        d["accumulate"] = "int32"
        return "accumulate"
    if c == "int8_acc":
        d["accumulate"] = "float32"
        return "accumulate"
    if c == "int8_noscale":
        del a["scale"]
        return "a.scale"
    if c == "int32_a_scale":
        a["scale"] = "row"
        return "a.scale"
    if c == "int8_wdtype":
        b["dtype"] = "uint8"
        return "b.dtype"
    if c == "fp8_wdtype":
        b["dtype"] = "float8_e5m2"
        return "b.dtype"
    if c == "e8m0_channel":
        b["scale"] = {"dtype": "e8m0", "group": draw(st.sampled_from(["channel", "tensor"]))}
        return "b.scale.dtype"
    if c == "codebook_len":
        b["codebook"] = b["codebook"] + [0.0]
        return "b.codebook"
    if c == "codebook_extra":
        key = draw(st.sampled_from(["codebook", "bits"]))
        b[key] = [0.0, 1.0] if key == "codebook" else 1
        return f"b.{key}"
    if c == "drop_pack":
        del b["pack"]
        return "b.pack"
    if c == "add_pack":
        b["pack"] = {"container": "int32", "axis": "k"}
        return "b.pack"
    if c == "zero_const":
        b["zero"] = {"kind": "const", "value": 1}
        return "b.zero.kind"
    if c == "order_len":
        b["pack"]["order"] = list(range(S.CONTAINER_BITS[b["pack"]["container"]] + 1))
        return "b.pack.order"
    if c == "group_not_mult_p":
        b["scale"]["group"] = b["scale"]["group"] + 1
        return "b.scale.group"
    if c == "group_not_div_k":
        b["scale"]["group"] = d["shape"]["K"] + 1
        return "b.scale.group"
    if c == "zero_unpacked":
        del b["zero"]["pack"]
        return "b.zero.pack"
    if c == "const_novalue":
        del b["zero"]["value"]
        return "b.zero.value"
    raise AssertionError(c)


MUTATIONS = [m_unknown_key, m_bad_value, m_missing, m_inconsistent]


@st.composite
def broken_spec_dicts(draw):
    d = copy.deepcopy(draw(valid_spec_dicts()))
    mutate = draw(st.sampled_from(MUTATIONS))
    path = mutate(d, draw)
    return d, path


def _line_names(text, line, path, d):
    """The YAML line an error points at names the field or its nearest present ancestor."""
    keys = path.split(".")
    while keys and _get(d, keys) is None and not (
            _get(d, keys[:-1]) is not None and keys[-1] in (_get(d, keys[:-1]) or {})):
        keys = keys[:-1]
    if not keys:
        return True
    return f"{keys[-1]}:" in text.splitlines()[line - 1]


@HYP
@given(broken_spec_dicts())
def test_broken_specs_report_the_field(case):
    d, path = case
    errs = _errors(spec_from_dict, d)
    assert path in errs.paths, (path, str(errs))
    assert all(isinstance(e, SpecError) and e.message for e in errs.errors)
    text = yaml.safe_dump(d, sort_keys=False, default_flow_style=False)
    ferrs = _errors(load_spec, text, filename="broken.yaml")
    assert path in ferrs.paths, (path, str(ferrs))
    for e in ferrs.errors:
        assert e.file == "broken.yaml" and e.line >= 1
    e = next(e for e in ferrs.errors if e.path == path)
    assert _line_names(text, e.line, path, d), (text, str(e))


# --- specific messages --------------------------------------------------------------------

def _gptq():
    return spec_to_yaml_dict(load_spec("gptq_v1_w4a16_g128"))


def test_all_problems_reported_with_lines():
    text = """\
opgen: 1
name: bad
op: matmul
a: {dtype: float16}
b:
  dtype: uint4
  pack: {container: int32, axis: k, order: [0, 1, 2]}
  scale: {dtype: e8m0, group: channel}
  zero: {kind: int, dtype: uint4}
epilogue: {bias: 3}
colour: red
"""
    errs = _errors(load_spec, text, filename="f.yaml")
    got = {(e.line, e.path) for e in errs.errors}
    assert {(7, "b.pack.order"), (8, "b.scale.dtype"), (9, "b.zero.pack"),
            (10, "epilogue.bias"), (11, "colour")} <= got
    for line in str(errs).splitlines():
        assert ERR_LINE.match(line), line
    msgs = {e.path: e.message for e in errs.errors}
    assert "(allowed:" in msgs["colour"] and "epilogue" in msgs["colour"]
    assert "permutation of 0..7" in msgs["b.pack.order"]


def test_allowed_values_listed():
    d = _gptq()
    d["b"]["dtype"] = "uint3"
    d["b"]["scale"]["group"] = "abc"
    errs = _errors(spec_from_dict, d)
    msgs = {e.path: e.message for e in errs.errors}
    assert "(allowed:" in msgs["b.dtype"] and "nf4" in msgs["b.dtype"]
    assert "channel" in msgs["b.scale.group"] and "positive integer" in msgs["b.scale.group"]


def test_float_format_zero_message():
    d = spec_to_yaml_dict(load_spec("bnb_nf4"))
    d["b"]["zero"] = {"kind": "float", "dtype": "float16"}
    errs = _errors(spec_from_dict, d)
    assert any(e.path == "b.zero.kind" and "format that has none" in e.message for e in errs.errors)


def test_codebook_3_bits_cannot_pack():
    d = _gptq()
    d["b"] = {"dtype": "codebook", "bits": 3, "codebook": [float(i) for i in range(8)],
              "pack": {"container": "int32", "axis": "k"}}
    errs = _errors(spec_from_dict, d)
    assert "b.pack.container" in errs.paths


def test_group_must_be_multiple_of_p_and_divide_k():
    d = _gptq()
    d["b"]["scale"]["group"] = 12
    d["shape"]["K"] = 4096
    assert "b.scale.group" in _errors(spec_from_dict, d).paths
    d["b"]["scale"]["group"] = 96
    assert "b.scale.group" in _errors(spec_from_dict, d).paths   # 4096 % 96
    d["shape"]["K"] = 96 * 8
    spec_from_dict(d)


def test_scale_layout_channel_is_canonical():
    d = spec_to_yaml_dict(load_spec("w8a8_int8"))
    d["b"]["scale"]["layout"] = "nk"
    assert spec_from_dict(d) == load_spec("w8a8_int8")


def test_non_mapping_document():
    errs = _errors(load_spec, "- 1\n- 2\n")
    assert errs.paths == ["spec"]


def test_specialize_shape():
    spec = load_spec("gptq_v1_w4a16_g128")
    assert specialize_shape(spec, M=3, K=4096) == S.Shape(3, None, 4096)
    with pytest.raises(UserError):
        specialize_shape(spec, K=100)
    fixed = spec_from_dict({**spec_to_yaml_dict(spec), "shape": {"K": 256}})
    assert specialize_shape(fixed).K == 256
    with pytest.raises(UserError, match="conflicts"):
        specialize_shape(fixed, K=512)


# --- what the kernels hold: sizes, the shape rule, exact zero points --------------------------

def _sym(a="float16", wdtype="uint4", value=8):
    d = spec_to_yaml_dict(load_spec("w4a16_sym_g128"))
    d["a"]["dtype"] = d["out"]["dtype"] = a
    d["b"]["dtype"] = wdtype
    if S.WEIGHT_CODES[wdtype].bits >= 8:
        del d["b"]["pack"]
    d["b"]["zero"] = {"kind": "const", "value": value}
    return d


@pytest.mark.parametrize("value", [2001, 1025, 2 ** 31, 2 ** 64 + 1, -2034])
def test_a_const_zero_beyond_exact_float16_is_refused(value):
    """2001 on 4-bit codes built a kernel that subtracted 2000 (1024 + 2001
    rounds in fp16), 2^31 and up subtracted +inf; check said ok."""
    errs = _errors(spec_from_dict, _sym(value=value))
    assert errs.paths == ["b.zero.value"], str(errs)
    m = errs.errors[0].message
    assert f"{value} is out of range (allowed: -2033..1024:" in m
    assert "float16 holds exactly" in m and "1024 + z" in m


def test_const_zero_bounds_follow_the_code_and_compute_types():
    for a, wd, lo, hi in [("float16", "uint4", -2033, 1024), ("bfloat16", "uint4", -241, 128),
                          ("float16", "int4", -2041, 1016),
                          ("bfloat16", "uint8", -1, 256)]:      # 8 bits in bf16: no magic number
        for v in (lo, hi):
            spec_from_dict(_sym(a, wd, v))
        for v in (lo - 1, hi + 1):
            assert _errors(spec_from_dict, _sym(a, wd, v)).paths == ["b.zero.value"]
        assert zero_range(spec_from_dict(_sym(a, wd, 0)))[:2] == (lo, hi)


@pytest.mark.parametrize("offset", [2 ** 31, 2 ** 64 + 1, 2034, -2034])
def test_an_int_zero_offset_beyond_exact_float16_is_refused(offset):
    d = _gptq()
    d["b"]["zero"]["offset"] = offset
    errs = _errors(spec_from_dict, d)
    assert errs.paths == ["b.zero.offset"], str(errs)
    assert "(allowed: -2033..2033:" in errs.errors[0].message
    for ok_offset in (-2033, 2033):
        d["b"]["zero"]["offset"] = ok_offset
        spec_from_dict(d)


def test_codebook_values_must_be_finite_in_the_activation_type():
    d = spec_to_yaml_dict(load_spec("bnb_nf4"))
    d["b"] = {"dtype": "codebook", "bits": 1, "codebook": [0.0, 70000.0],
              "pack": {"container": "uint8", "axis": "k"}}
    errs = _errors(spec_from_dict, d)
    assert errs.paths == ["b.codebook"] and "|x| <= 65504" in errs.errors[0].message
    d["a"]["dtype"] = d["out"]["dtype"] = "bfloat16"
    spec_from_dict(d)
    d["b"]["codebook"] = [0.0, 10 ** 400]                  # no OverflowError
    assert "finite numbers" in _errors(spec_from_dict, d).errors[0].message


@pytest.mark.parametrize("path,value", [(("shape", "M"), 2 ** 31), (("shape", "N"), 2 ** 31),
                                        (("shape", "K"), 2 ** 64 + 1), (("shape", "K"), 2 ** 30),
                                        (("b", "scale", "group"), 2 ** 31)])
def test_sizes_beyond_32_bit_indexing_are_refused(path, value):
    d = _gptq()
    _get(d, path[:-1])[path[-1]] = value
    errs = _errors(spec_from_dict, d)
    assert ".".join(path) in errs.paths, str(errs)
    m = next(e.message for e in errs.errors if e.path == ".".join(path))
    assert "(allowed: 1..1073741823" in m and "32-bit" in m


def test_a_scale_table_beyond_32_bit_indexing_is_refused():
    d = _gptq()
    d["shape"]["N"], d["shape"]["K"] = 2 ** 20, 2 ** 19          # 2^32 scales of group 128
    errs = _errors(spec_from_dict, d)
    assert errs.paths == ["shape.K"] and "32-bit index" in errs.errors[0].message
    d["shape"]["N"] = 2 ** 17                                   # 2^29
    spec_from_dict(d)


FIXED = """\
opgen: 1
name: fixed
op: matmul
shape:
  N: {N}
  K: {K}
a: {{dtype: float16}}
b: {b}
"""


@pytest.mark.parametrize("N,K,b,where", [
    (3, 5, "{dtype: float8_e4m3, scale: {dtype: float32, group: channel}}",
     {(5, "shape.N"), (6, "shape.K")}),
    (4104, 4096, "{dtype: uint4, layout: nn, pack: {container: int32, axis: n}, "
                 "scale: {dtype: float16, group: 128}}", {(5, "shape.N")}),
    (256, 512, "{dtype: uint4, pack: {container: int32, axis: k}, scale: {dtype: float16, "
               "group: 128}, zero: {kind: int, dtype: uint4, pack: {container: int32, axis: k}}}",
     {(6, "shape.K")}),
    (8, 512, "{dtype: uint2, pack: {container: int32, axis: k}, scale: {dtype: float16, "
             "group: 128}, zero: {kind: int, dtype: uint2, pack: {container: int32, axis: n}}}",
     {(5, "shape.N")}),
])
def test_check_applies_the_shape_rule_of_build(N, K, b, where):
    """The sizes a spec fixes meet the rule build and opgen.load apply
    (planner.shape_problems): fp8 N = 3, K = 5 and AWQ N = 4104 passed check;
    zero points packed 8 to an int32 along k need K / group = 4 a multiple of
    8, 16 two-bit ones along n N = 8 a multiple of 16."""
    errs = _errors(load_spec, FIXED.format(N=N, K=K, b=b), filename="f.yaml")
    assert {(e.line, e.path) for e in errs.errors} == where, str(errs)
    for line in str(errs).splitlines():
        assert re.match(r"^f\.yaml:\d+: shape\.[NK]: [NK]=\d+ must be a multiple of \d+", line), line


def test_quantize_k_follows_its_kernel():
    d = spec_to_yaml_dict(load_spec("quantize_int8_row"))
    d["shape"] = {"K": 12}
    errs = _errors(spec_from_dict, d)
    assert errs.paths == ["shape.K"] and "multiple of 8" in errs.errors[0].message
    spec = load_spec("quantize_int8_row")
    with pytest.raises(UserError, match="K=12 must be a positive multiple of 8"):
        specialize_shape(spec, K=12)
    assert specialize_shape(spec, K=4096).K == 4096


def test_specialize_shape_applies_the_size_bounds():
    spec = load_spec("gptq_v1_w4a16_g128")
    for kw in (dict(N=2 ** 31), dict(M=2 ** 31), dict(K=2 ** 64 + 1)):
        with pytest.raises(UserError, match="32-bit"):
            specialize_shape(spec, **kw)
    with pytest.raises(UserError, match="16-byte rows"):
        specialize_shape(load_spec("awq_w4a16_g128"), N=4104)


# --- 8-bit activations with sub-byte weights, the int32 output (issue 29) ---------------------

A8_EXAMPLES = sorted(A8_PATHS.values(), key=lambda p: p.stem)


def test_the_five_a8_specs_are_there():
    assert [p.stem for p in A8_EXAMPLES] == ["bitnet_b158_a8", "int8_int4_int32", "w4a8_fp8",
                                             "w4a8_int8", "w4a8_int8_g128"]


@pytest.mark.parametrize("path", A8_EXAMPLES, ids=lambda p: p.stem)
def test_a8_specs_check(path, capsys):
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: ok ({path.stem})"


def test_fp8_activations_with_sub_byte_weights_run_everywhere():
    """sm_89+: codes widened to e4m3 for the fp8 MMA (sm_90: also into the
    rs GEMM's e4m3 wgmma registers); sm_80 (no e4m3 MMA): activations and
    codes widened to fp16 (above M = 16, where the GEMVs stop: the cp.async
    GEMM only)."""
    s = load_spec(A8_PATHS["w4a8_fp8"])
    for arch in ("sm_90", "sm_80"):
        cands = planner.candidates(s, arch, 64, 4096, 4096)
        assert cands and all(c.family == "gemm" and (c.rs or not c.tma) and not c.predecode
                             for c in cands)
        assert any(c.rs for c in cands) == (arch == "sm_90")
    assert planner.geometry(s, cands[0], "sm_80")["a_decode"]


def test_int8_weights_with_an_int32_output_run_on_the_cp_async_gemm():
    d = spec_to_yaml_dict(load_spec("w8a8_int8"))
    del d["a"]["scale"], d["b"]["scale"]
    d["out"]["dtype"] = "int32"
    spec = spec_from_dict(d)
    cands = planner.candidates(spec, "sm_90", 64, 4096, 4096)
    assert cands and all(c.family == "gemm" and not c.tma and c.split_k == 1 for c in cands)


def _a8(a="int8", wdtype="uint4", scale="channel", zero=None, out="float16"):
    """A spec of a activations and wdtype weights (pack int32 along k below 8 bits)."""
    b = {"dtype": wdtype}
    bits = S.WEIGHT_CODES[wdtype].bits
    if bits < 8:
        b["pack"] = {"container": "int32", "axis": "k"}
    if scale is not None:
        b["scale"] = {"dtype": "float16", "group": scale}
    if zero is not None:
        b["zero"] = zero
    d = {"opgen": 1, "name": "a8", "op": "matmul", "a": {"dtype": a, "scale": "row"}, "b": b,
         "accumulate": "int32" if a == "int8" else "float32", "out": {"dtype": out}}
    if out == "int32":
        del d["a"]["scale"]
    return d


UINT4_ZERO = {"kind": "int", "dtype": "uint4", "pack": {"container": "int32", "axis": "n"}}


@pytest.mark.parametrize("a", S.A8_DTYPES)
@pytest.mark.parametrize("wdtype", ["uint4", "int4", "uint2", "int2", "uint1", "ternary"])
@pytest.mark.parametrize("scale", [None, "channel", "tensor", 128])
def test_a8_sub_byte_weights_accepted(a, wdtype, scale):
    d = _a8(a, wdtype, scale)
    spec_from_dict(d)
    d["b"]["formula"] = "q * s - z"                 # without a zero point: the same weight
    spec_from_dict(d)
    if wdtype != "ternary" and scale is not None:
        spec_from_dict(_a8(a, wdtype, scale, zero={"kind": "const", "value": 1}))
    if wdtype != "ternary" and scale in ("channel", 128):
        zd = {"uint4": "uint4", "int4": "int4"}.get(wdtype, "uint1")
        spec_from_dict(_a8(a, wdtype, scale, zero={**UINT4_ZERO, "dtype": zd}))


def test_sub_byte_codes_are_the_integer_ones_below_8_bits():
    assert set(SUB_BYTE_INT_DTYPES) == {"uint4", "int4", "uint2", "int2", "uint1", "ternary"}


def test_the_a8_decode_bounds_are_the_types():
    """int8 holds -128..127; e4m3 (3 mantissa bits) every integer |x| <= 16, not 17."""
    assert A8_DECODE_INTS["int8"] == (np.iinfo(np.int8).min, np.iinfo(np.int8).max)
    lo, hi = A8_DECODE_INTS["float8_e4m3"]
    xs = np.arange(lo, hi + 1, dtype=np.float32)
    assert np.array_equal(nx.fp8_e4m3_to_f32(nx.f32_to_fp8_e4m3(xs)), xs) and lo == -hi
    assert nx.fp8_e4m3_to_f32(nx.f32_to_fp8_e4m3(np.float32(hi + 1))) != hi + 1


@pytest.mark.parametrize("d,path,says", [
    (_a8(wdtype="uint8"), "b.dtype",
     "int8 activations need int8 weights or integer codes below 8 bits; got uint8 "
     "(allowed: int8, int4, uint4, int2, uint2, uint1, ternary)"),
    (_a8(wdtype="nf4"), "b.dtype", "got nf4 (allowed: int8, int4"),
    (_a8("float8_e4m3", "float8_e5m2"), "b.dtype", "(allowed: float8_e4m3, int4, uint4"),
    (_a8(wdtype="int8", scale=128), "b.scale.group",
     "int8 weights with int8 activations take a channel or tensor scale or none, not group 128"),
    (_a8("float8_e4m3", "float8_e4m3", scale=128), "b.scale.group", "not group 128"),
    (_a8(wdtype="int8", zero={"kind": "const", "value": 1}), "b.zero.kind",
     "int8 weights with int8 activations take no zero point (allowed: none"),
    (_a8(zero={"kind": "float", "dtype": "float16"}), "b.zero.kind",
     "float zero points with int8 activations: q - z would not be an integer, which the 8-bit "
     "product needs (allowed: none, const, int)"),
    (_a8("float8_e4m3", zero={"kind": "float", "dtype": "float16"}), "b.zero.kind",
     "(allowed: none, const, int)"),
    ({**_a8(), "b": {**_a8(zero={"kind": "const", "value": 8})["b"], "formula": "q * s - z"}},
     "b.formula", "with a zero point has no such integer (allowed: (q - z) * s)"),
    (_a8(zero={"kind": "const", "value": 129}), "b.zero.value",
     "129 is out of range (allowed: -112..128: every q - z over the uint4 codes q = 0..15 "
     "must be an integer int8 holds, -128..127)"),
    (_a8("float8_e4m3", zero={"kind": "const", "value": 17}), "b.zero.value",
     "(allowed: -1..16: every q - z over the uint4 codes q = 0..15 must be an integer "
     "float8_e4m3 holds exactly, |x| <= 16)"),
    (_a8("float8_e4m3", "int4", zero={"kind": "const", "value": -10}), "b.zero.value",
     "(allowed: -9..8:"),
    (_a8("float8_e4m3", zero={**UINT4_ZERO, "offset": 2}), "b.zero.offset",
     "2 is out of range (allowed: -1..1:"),
    (_a8(zero={"kind": "int", "dtype": "uint8"}), "b.zero.dtype",
     "uint8 zero points (0..255) cannot all be exact: every zero point z = stored + offset "
     "over the uint8 codes 0..255, and every q - z over the uint4 codes q = 0..15, must be an "
     "integer int8 holds, -128..127 (allowed: uint4, uint2, uint1, int4, int2)"),
    # the int32 output: int8 activations, no scale anywhere, no epilogue
    ({**_a8(out="int32"), "a": {"dtype": "int8", "scale": "row"}}, "a.scale",
     "an int32 output is the raw accumulator, which no scale applies to: remove a.scale"),
    (_a8(scale=128, out="int32"), "b.scale", "no scale applies to: remove b.scale"),
    ({**_a8(scale=None, out="int32"), "epilogue": {"bias": True}}, "epilogue.bias",
     "no bias (allowed: false)"),
    ({**_a8(scale=None, out="int32"), "epilogue": {"activation": "relu"}},
     "epilogue.activation", "no activation (allowed: none)"),
    ({**_a8("float8_e4m3", scale=None, out="int32")}, "out.dtype",
     "int32 is the raw int32 accumulator of int8 activations; a.dtype is float8_e4m3 "
     "(allowed with it: float16, bfloat16, float32)"),
    ({**_gptq(), "out": {"dtype": "int32"}}, "out.dtype", "a.dtype is float16"),
    ({**_a8(scale=None), "a": {"dtype": "int8"}}, "a.scale",
     "int8 activations need `scale: row` (a per-row float32 scale) unless out.dtype is int32"),
    ({**_a8("float8_e4m3", scale=None), "a": {"dtype": "float8_e4m3"}}, "a.scale",
     "float8_e4m3 activations need `scale: row` (a per-row float32 scale)"),
])
def test_a8_and_int32_output_refusals_name_the_field(d, path, says):
    errs = _errors(spec_from_dict, d)
    assert path in errs.paths, str(errs)
    assert says in next(e.message for e in errs.errors if e.path == path), str(errs)
    for line in str(errs).splitlines():
        assert ERR_LINE.match(line), line


@pytest.mark.parametrize("a,wd,zd,lo,hi", [
    ("int8", "uint4", "uint4", -112, 112), ("int8", "int4", "int4", -112, 113),
    ("float8_e4m3", "uint4", "uint4", -1, 1), ("float8_e4m3", "uint2", "uint2", -13, 13),
    ("float8_e4m3", "int4", "uint4", -9, -7),       # int4 codes, uint4 zeros: q - z down to -23
])
def test_int_zero_offsets_follow_the_8_bit_type(a, wd, zd, lo, hi):
    """Each end of the range is accepted, one past it refused."""
    for v, ok in ((lo, True), (hi, True), (lo - 1, False), (hi + 1, False)):
        d = _a8(a, wd, zero={**UINT4_ZERO, "dtype": zd, "offset": v})
        if ok:
            assert zero_range(spec_from_dict(d))[:2] == (lo, hi)
        else:
            assert _errors(spec_from_dict, d).paths == ["b.zero.offset"]


def test_docs_show_the_a8_examples():
    """docs/spec.md's example block holds the five specs (descriptions aside)."""
    text = (Path(__file__).parents[2] / "docs" / "spec.md").read_text()
    block = text.split("#### Example specs: 8-bit activations with sub-byte weights")[1]
    block = block.split("```yaml\n")[1].split("```")[0]
    shown = {d["name"]: spec_from_dict(d) for d in yaml.safe_load_all(block)}
    files = {p.stem: load_spec(p) for p in A8_EXAMPLES}
    assert set(shown) == set(files)
    for name, spec in files.items():
        assert shown[name].content_hash() == spec.content_hash(), name

"""Finding specs (codegen/resolve.py): the shipped set, each loaded by path
and by name, what each shipped spec holds, names that are neither; reading
a file: bounded in size, not-UTF-8 bytes located."""
from __future__ import annotations

import time

import pytest

from opgen.codegen import spec as S
from opgen.codegen.errors import SpecErrors
from opgen.codegen.resolve import as_spec, load_spec, resolve_spec, shipped_specs
from opgen.codegen.yaml_source import MAX_SPEC_BYTES

SHIPPED = (
    "gptq_v1_w4a16_g128", "gptq_v2_w4a16_g128", "gptq_v1_w4a16_g128_repacked",
    "gptq_v2_w4a16_g128_repacked", "awq_w4a16_g128", "bnb_nf4",
    "bitnet_b158", "mxfp4", "w8a8_int8", "w4a16_sym_g128", "w2a16_g128", "w1a16_g128",
    "fp8_e4m3_w8a8", "fp8_e4m3_w8a16", "fp16", "quantize_int8_row", "quantize_fp8_row",
    "w4a8_int8", "w4a8_int8_g128", "bitnet_b158_a8", "int8_int4_int32", "w4a8_fp8",
)


def _errors(fn, *args, **kw) -> SpecErrors:
    with pytest.raises(SpecErrors) as ei:
        fn(*args, **kw)
    return ei.value


def test_shipped_set_is_exact():
    assert set(shipped_specs()) == set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spec_loads(name):
    path = resolve_spec(name)
    spec = load_spec(path)
    assert spec.name == name == path.stem
    assert spec.description and "\n" not in spec.description
    assert spec.shape == S.Shape(None, None, None)
    assert load_spec(name) == spec                      # by shipped name, too
    hash(spec)


def test_shipped_spec_facts():
    g1, g2, awq = (load_spec(n) for n in ("gptq_v1_w4a16_g128", "gptq_v2_w4a16_g128",
                                          "awq_w4a16_g128"))
    seq8 = tuple(range(8))
    il8 = (0, 2, 4, 6, 1, 3, 5, 7)
    assert g1.b == S.Weight(
        dtype="uint4", layout="nn", pack=S.Pack("int32", "k", seq8),
        scale=S.Scale("float16", "group", 128, "kn"),
        zero=S.Zero("int", "uint4", S.Pack("int32", "n", seq8), offset=1))
    assert g2.b == S.Weight(
        dtype="uint4", layout="nn", pack=S.Pack("int32", "k", seq8),
        scale=S.Scale("float16", "group", 128, "kn"),
        zero=S.Zero("int", "uint4", S.Pack("int32", "n", seq8), offset=0))
    assert awq.b == S.Weight(
        dtype="uint4", layout="nn", pack=S.Pack("int32", "n", il8),
        scale=S.Scale("float16", "group", 128, "kn"),
        zero=S.Zero("int", "uint4", S.Pack("int32", "n", il8), offset=0))
    nf4 = load_spec("bnb_nf4").b
    assert (nf4.dtype, nf4.layout, nf4.pack, nf4.scale, nf4.zero.kind) == (
        "nf4", "nt", S.Pack("uint8", "k", (1, 0)), S.Scale("float32", "group", 64, "nk"), "none")
    bn = load_spec("bitnet_b158").b
    assert (bn.dtype, bn.pack, bn.scale.granularity, bn.scale.dtype) == (
        "ternary", S.Pack("uint8", "k", (0, 1, 2, 3)), "tensor", "float32")
    mx = load_spec("mxfp4").b
    assert (mx.dtype, mx.pack, mx.scale) == (
        "fp4_e2m1", S.Pack("uint8", "k", (0, 1)), S.Scale("e8m0", "group", 32, "nk"))
    w8 = load_spec("w8a8_int8")
    assert (w8.a, w8.b.dtype, w8.b.scale.granularity, w8.accumulate, w8.out.dtype) == (
        S.Activation("int8", "row"), "int8", "channel", "int32", "float16")
    sym = load_spec("w4a16_sym_g128").b
    assert (sym.pack, sym.scale, sym.zero) == (
        S.Pack("int32", "k", il8), S.Scale("float16", "group", 128, "nk"),
        S.Zero("const", value=8))
    w2 = load_spec("w2a16_g128").b
    assert (w2.dtype, w2.pack, w2.zero) == (
        "uint2", S.Pack("int32", "k", tuple(range(16))), S.Zero("const", value=2))
    w1 = load_spec("w1a16_g128").b
    assert (w1.dtype, w1.pack.order, w1.zero, w1.formula) == (
        "uint1", tuple(range(32)), S.Zero("float", "float16"), "q * s - z")
    f8 = load_spec("fp8_e4m3_w8a8")
    assert (f8.a, f8.b.dtype, f8.accumulate, f8.out.dtype) == (
        S.Activation("float8_e4m3", "row"), "float8_e4m3", "float32", "bfloat16")
    assert load_spec("fp8_e4m3_w8a16").a == S.Activation("float16")
    fp16 = load_spec("fp16")
    assert fp16.b == S.Weight("float16", "nt")
    for name, out in (("quantize_int8_row", "int8"), ("quantize_fp8_row", "float8_e4m3")):
        q = load_spec(name)
        assert (q.op, q.a.dtype, q.b, q.out.dtype) == ("quantize", "float16", None, out)


def test_resolve_unknown_lists_shipped():
    errs = _errors(resolve_spec, "no_such_spec")
    assert "gptq_v1_w4a16_g128" in str(errs) and "bnb_nf4" in str(errs)


def test_unusable_paths_and_yaml_text_say_what_they_are():
    with pytest.raises(SpecErrors, match=r"a{117}\.\.\.:0: spec: cannot use this path: File name too long"):
        resolve_spec("a" * 300)
    with pytest.raises(SpecErrors, match=r"<YAML text>:0: spec: .*load_spec reads it"):
        resolve_spec(shipped_specs()["fp16"].read_text())


def test_as_spec(tmp_path):
    spec = as_spec("awq_w4a16_g128")
    assert as_spec(spec) is spec
    assert as_spec("awq_w4a16_g128") is spec            # shipped specs are read once
    assert as_spec("awq_w4a16_g128.yaml") == spec
    f = tmp_path / "mine.yaml"
    f.write_text(resolve_spec("awq_w4a16_g128").read_text())
    assert as_spec(str(f)) == spec and as_spec(f) == spec
    broken = tmp_path / "broken.yaml"
    broken.write_text("opgen: 1\nname: x\n")
    errs = _errors(as_spec, str(broken))
    assert errs.errors and all(e.file == str(broken) for e in errs.errors)
    assert "shipped" in str(_errors(as_spec, "no_such_spec"))


def test_an_oversized_file_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"k: 1\n" * (1 << 20))                 # 5 MiB of keys
    t0 = time.perf_counter()
    errs = _errors(load_spec, big)
    assert time.perf_counter() - t0 < 1.0
    (e,) = errs.errors
    assert (e.file, e.line, e.path) == (str(big), 1, "spec")
    assert f"is {5 << 20} bytes" in e.message and f"at most {MAX_SPEC_BYTES}" in e.message


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("opgen: 1\nname: x\ndescription: caf\xe9\n".encode("latin-1"))
    (e,) = _errors(as_spec, str(f)).errors
    assert (e.file, e.line, e.path) == (str(f), 3, "yaml") and "0xe9 is not UTF-8" in e.message

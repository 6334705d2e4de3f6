"""`opgen check`, `opgen list` and `opgen schema` (opgen/cli/specs.py): a line
per spec that is fine, every problem as one located line on stderr and exit
2, no traceback from the command line (what the kernels cannot hold
included), the shipped specs listed, the JSON Schema printed or written."""
import json
import re
import subprocess
import sys

import yaml

from opgen.cli import main, specs
from opgen.codegen.canonical import spec_to_yaml_dict
from opgen.codegen.resolve import load_spec, shipped_specs
from opgen.codegen.schema import schema_text, shipped_schema

ERR_LINE = re.compile(r"^.+:\d+: [a-z_.0-9]+: .+$")


def _gptq():
    return spec_to_yaml_dict(load_spec("gptq_v1_w4a16_g128"))


BROKEN = """\
opgen: 1
name: broken
op: matmul
a: {dtype: float16}
b:
  dtype: uint4
  pack: {container: int32, axis: q}
  scale: {dtype: float16, group: abc}
accumulate: int32
"""


def test_cli_check_ok(capsys, tmp_path):
    assert main(["check", "gptq_v1_w4a16_g128"]) == 0
    assert capsys.readouterr().out.strip() == "gptq_v1_w4a16_g128: ok (gptq_v1_w4a16_g128)"
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(_gptq()))
    assert main(["check", str(f)]) == 0
    assert capsys.readouterr().out.strip() == f"{f}: ok (gptq_v1_w4a16_g128)"


def test_cli_check_broken(capsys, tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text(BROKEN)
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3
    for line in err:
        assert ERR_LINE.match(line) and line.startswith(f"{f}:"), line
    assert any(":7: b.pack.axis:" in x for x in err)
    assert any(":8: b.scale.group:" in x for x in err)
    assert any(":9: accumulate:" in x for x in err)


def test_cli_subprocess_no_traceback(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text(BROKEN)
    m = tmp_path / "malformed.yaml"
    m.write_text("opgen: 1\nname: x\nb: {dtype: [uint4\n")
    r = subprocess.run([sys.executable, "-m", "opgen", "check", str(f), str(m)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert all(ERR_LINE.match(x) for x in lines), r.stderr
    assert any(x.startswith(f"{m}:") and ": yaml: " in x for x in lines)
    assert re.search(rf"^{re.escape(str(m))}:[34]: yaml: malformed YAML", r.stderr, re.M)


def test_cli_unknown_spec(capsys):
    assert main(["check", "nope_not_a_spec"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "fp16" in err and "shipped" in err


def test_cli_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in shipped_specs():
        assert re.search(rf"^{name}\s+\S", out, re.M), name




def test_cli_check_goes_on_past_a_broken_file(capsys, tmp_path):
    """Every argument is checked: the good ones say ok, all problems of the
    broken ones are reported together, and the exit status is 2."""
    f = tmp_path / "broken.yaml"
    f.write_text(BROKEN)
    assert main(["check", str(f), "w8a8_int8"]) == 2
    out, err = capsys.readouterr()
    assert out.strip() == "w8a8_int8: ok (w8a8_int8)"
    assert len(err.strip().splitlines()) == 3


def test_cli_list_names_a_broken_shipped_spec(capsys, monkeypatch, tmp_path):
    """A shipped spec that does not validate is a bug: `opgen list` says so
    on its line and lists the others."""
    f = tmp_path / "broken.yaml"
    f.write_text(BROKEN)
    monkeypatch.setattr(specs, "shipped_specs",
                        lambda: {"broken": f, "w8a8_int8": shipped_specs()["w8a8_int8"]})
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert re.match(rf"^broken\s+\(invalid: {re.escape(str(f))}:\d+: ", lines[0]), lines[0]
    assert lines[1].startswith("w8a8_int8 ") and load_spec("w8a8_int8").description in lines[1]


# --- what the kernels hold, from the command line -------------------------------------------

SILENTLY_WRONG = {
    "const_2001.yaml": ("opgen: 1\nname: w4\nop: matmul\na: {dtype: float16}\nb:\n  dtype: uint4\n"
                        "  pack: {container: int32, axis: k}\n  scale: {dtype: float16, group: 128}\n"
                        "  zero: {kind: const, value: 2001}\n", ":9: b.zero.value: 2001 is out of range"),
    "fp8_3x5.yaml": ("opgen: 1\nname: f\nop: matmul\nshape: {N: 3, K: 5}\na: {dtype: float16}\n"
                     "b: {dtype: float8_e4m3, scale: {dtype: float32, group: channel}}\n",
                     ":4: shape.K: K=5 must be a multiple of 32"),
    "n_2e31.yaml": ("opgen: 1\nname: f\nop: matmul\nshape: {N: 2147483648}\na: {dtype: float16}\n"
                    "b: {dtype: float16}\n", ":4: shape.N: 2147483648 is not a valid N (allowed: 1.."),
}


def test_cli_check_refuses_what_the_kernels_cannot_hold(tmp_path):
    """check said ok to a const zero of 2001, fixed sizes build refuses, sizes
    past 32-bit indexing: now one located line each, exit 2, no traceback."""
    files = []
    for name, (text, _) in SILENTLY_WRONG.items():
        (tmp_path / name).write_text(text)
        files.append(str(tmp_path / name))
    r = subprocess.run([sys.executable, "-m", "opgen", "check", *files], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    for name, (_, want) in SILENTLY_WRONG.items():
        assert f"{tmp_path / name}{want}" in r.stderr, r.stderr
    for line in r.stderr.strip().splitlines():
        assert re.match(r"^.+:\d+: [A-Za-z_.0-9]+: .+$", line), line


def test_cli_schema_prints_the_shipped_schema(capsys, tmp_path):
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert out == schema_text() == shipped_schema().read_text()
    assert json.loads(out)["$schema"].endswith("/draft/2020-12/schema")
    f = tmp_path / "opgen-spec.schema.json"
    assert main(["schema", "-o", str(f)]) == 0
    assert capsys.readouterr().out.strip() == str(f) and f.read_text() == out


def test_cli_schema_unwritable_is_one_line(capsys, tmp_path):
    assert main(["schema", "-o", str(tmp_path / "no" / "such" / "dir.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opgen: error: cannot write ")
    assert main(["schema", "-o", str(tmp_path)]) == 2              # a directory
    assert len(capsys.readouterr().err.strip().splitlines()) == 1

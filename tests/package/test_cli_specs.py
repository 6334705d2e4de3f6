"""`opgen check` and `opgen list` (opgen/cli/specs.py): a line per spec that
is fine, every problem as one located line on stderr and exit 2, no traceback
from the command line, the shipped specs listed."""
import re
import subprocess
import sys

import yaml

from opgen.cli import main, specs
from opgen.codegen.canonical import spec_to_yaml_dict
from opgen.codegen.resolve import load_spec, shipped_specs

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

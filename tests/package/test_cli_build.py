"""`opgen build` (opgen/cli/build.py): what it hands codegen.build_spec, the
sizes that do not fit the spec or the kernels (quantize's K included), the
arches it offers, and the warning for a kernel ptxas gave local memory."""
import json
import re
from pathlib import Path

import pytest

from opgen.cli import build as cli_build
from opgen.cli import main
from opgen.codegen import hw


def test_cli_build_calls_build_spec(capsys, monkeypatch, tmp_path):
    calls = []

    def build_spec(spec, out_dir, arch, M=None, N=None, K=None):
        calls.append((spec.name, Path(out_dir), arch, M, N, K))
        return [Path(out_dir) / "a.cu", Path(out_dir) / "a.h"]

    monkeypatch.setattr("opgen.cli.build.build_spec", build_spec)
    rc = main(["build", "awq_w4a16_g128", "-o", str(tmp_path), "--arch", "sm_90",
               "--K", "4096", "--N", "8192"])
    assert rc == 0
    assert calls == [("awq_w4a16_g128", tmp_path, "sm_90", None, 8192, 4096)]
    assert capsys.readouterr().out.split() == [str(tmp_path / "a.cu"), str(tmp_path / "a.h")]
    # sizes that do not fit the spec: one line, exit 2
    assert main(["build", "awq_w4a16_g128", "-o", str(tmp_path), "--K", "100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opgen: error: ")
    assert len(calls) == 1


def test_cli_build_offers_the_known_arches(monkeypatch, tmp_path):
    monkeypatch.setattr("opgen.cli.build.build_spec", lambda *a, **k: [])
    for arch in hw.ARCHS:
        assert main(["build", "w8a8_int8", "-o", str(tmp_path), "--arch", arch]) == 0
    with pytest.raises(SystemExit) as ei:
        main(["build", "w8a8_int8", "-o", str(tmp_path), "--arch", "sm_75"])
    assert ei.value.code == 2


def _plan(tmp_path, kernels):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"kernels": kernels}))
    return p


def test_spill_warnings(tmp_path):
    """One line per launch ptxas gave spills or a stack frame, predecode's
    first stage included; none for clean kernels or without a plan."""
    clean = {"spill_bytes": 0, "stack": 0, "registers": 90}
    plan = _plan(tmp_path, {
        "gemv_a": {"entry": "k_a", "ptxas": clean},
        "gemm_b": {"entry": "k_b", "ptxas": {"spill_bytes": 24, "stack": 32},
                   "before": [{"entry": "k_b_dequant", "ptxas": {"spill_bytes": 0, "stack": 8}}]}})
    lines = cli_build.spill_warnings(plan)
    assert sorted(lines) == [
        "k_b: ptxas spills 24 bytes (stack frame 32 bytes); see plan.json",
        "k_b_dequant: ptxas spills 0 bytes (stack frame 8 bytes); see plan.json"]
    assert cli_build.spill_warnings(_plan(tmp_path, {"gemv_a": {"entry": "k_a", "ptxas": clean}})) == []
    assert cli_build.spill_warnings(None) == []
    assert cli_build.spill_warnings(tmp_path / "missing.json") == []


def test_cli_build_warns_of_spills(capsys, monkeypatch, tmp_path):
    """The paths on stdout, the spill warnings of the plan it wrote on stderr;
    the build still succeeds."""
    def build_spec(spec, out_dir, arch, M=None, N=None, K=None):
        plan = _plan(Path(out_dir), {"g": {"entry": "k_g", "ptxas": {"spill_bytes": 4, "stack": 0}}})
        return [Path(out_dir) / "g.cu", plan]

    monkeypatch.setattr("opgen.cli.build.build_spec", build_spec)
    assert main(["build", "w8a8_int8", "-o", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.split() == [str(tmp_path / "g.cu"), str(tmp_path / "plan.json")]
    assert err.strip() == ("opgen: warning: k_g: ptxas spills 4 bytes (stack frame 0 bytes); "
                           "see plan.json")


@pytest.mark.parametrize("argv,match", [
    (["quantize_int8_row", "--K", "12"], "K=12 must be a positive multiple of 8"),
    (["quantize_int8_row", "--N", "4096"], "op quantize has no N"),
    (["gptq_v2_w4a16_g128", "--N", str(2 ** 31)], "2147483648 is not a valid N .*32-bit int"),
    (["gptq_v2_w4a16_g128", "--M", str(2 ** 64 + 1)], "is not a valid M .*32-bit int"),
    (["awq_w4a16_g128", "--N", "4104"], "N=4104 must be a multiple of 32"),
])
def test_cli_build_validates_the_sizes_it_is_given(argv, match, capsys, monkeypatch, tmp_path):
    """`opgen build quantize_* --K` was not validated; sizes past the kernels'
    32-bit indexing built: one line, exit 2, before build_spec runs."""
    monkeypatch.setattr("opgen.cli.build.build_spec", lambda *a, **k: pytest.fail("built"))
    assert main(["build", *argv, "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opgen: error: ") and re.search(match, err[0]), err


def test_cli_build_passes_the_quantize_K(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("opgen.cli.build.build_spec",
                        lambda spec, out, arch, M=None, N=None, K=None: calls.append(K) or [])
    assert main(["build", "quantize_int8_row", "-o", str(tmp_path), "--K", "4096"]) == 0
    assert calls == [4096]


def test_cli_build_names_an_output_directory_it_cannot_use(capsys, monkeypatch, tmp_path):
    """--out that is a file, under a file, or empty: one line naming --out,
    exit 2, before any compile."""
    monkeypatch.setattr("opgen.cli.build.build_spec", lambda *a, **k: pytest.fail("built"))
    (tmp_path / "afile").write_text("x")
    for out, why in ((tmp_path / "afile", "cannot make the output directory"),
                     (tmp_path / "afile" / "sub", "cannot make the output directory"),
                     ("", "an empty path")):
        assert main(["build", "w8a8_int8", "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("opgen: error: --out") and why in err[0], err


def test_cli_build_names_a_file_it_cannot_write_under_a_relative_out(capsys, monkeypatch, tmp_path):
    """A relative --out: the OS error names the absolute temporary file and
    the relative target (os.replace's); still one line naming --out, exit 2."""
    monkeypatch.chdir(tmp_path)

    def replace_fails(spec, out_dir, *a, **k):
        raise IsADirectoryError(21, "Is a directory", str((out_dir / "plan.json.x1.tmp").absolute()),
                                None, str(out_dir / "plan.json"))
    monkeypatch.setattr("opgen.cli.build.build_spec", replace_fails)
    assert main(["build", "w8a8_int8", "-o", "pj"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["opgen: error: --out pj: cannot write pj/plan.json (Is a directory)"]


def test_cli_build_with_an_unwritable_cache_warns_once_and_builds(capsys, monkeypatch, tmp_path):
    """OPGEN_CACHE_DIR where no directory can be: the kernels still build;
    one `opgen: warning:` line names the cache and the variable."""
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path / "afile"))
    assert main(["build", "w4a16_sym_g128", "-o", str(tmp_path / "out"), "--M", "1"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opgen: warning: the cubin cache") and "OPGEN_CACHE_DIR" in err[0]
    assert (tmp_path / "out" / "plan.json").is_file()

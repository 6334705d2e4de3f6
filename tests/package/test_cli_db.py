"""`opgen db show|prune|export` (opgen/cli/db.py)."""
import pytest

from opgen.cli import make_parser
from opgen.codegen.spec import Activation, Output, Scale, Spec, Weight
from opgen.runtime.tuning_db import TuningDB, make_key, make_record

SPEC = Spec(name="w4a16_test", op="matmul", a=Activation("float16"),
            b=Weight("uint4", scale=Scale("float16", "group", 128)), out=Output("float16"))


def key_for(spec=SPEC, N=1024, K=2048, version="0.1.0", device="NVIDIA H200"):
    return make_key(spec, N, K, arch="sm_90", device=device, nvrtc="12.9", version=version)


def rec(us=10.0, M=16, **cfg):
    return make_record(cfg or {"bm": 16, "bn": 128}, us, M=M, runner_up_us=[us * 1.1],
                       heuristic_us=us * 1.3, config_name="cfg")


@pytest.fixture
def path(tmp_path):
    return tmp_path / "sub" / "tuning.json"


def test_cli(path, tmp_path, capsys):
    db = TuningDB(path, shipped=False)
    db.put_many([(key_for(), "1", rec(2.0)), (key_for(version="0.0.1"), "1", rec(3.0))])
    parser = make_parser()

    def run(*argv):
        args = parser.parse_args(list(argv))
        assert args._run(args) == 0
        return capsys.readouterr().out

    out = run("db", "show", "--path", str(path), "--no-shipped")
    assert "w4a16_test" in out and "speedup" in out and "1.30" in out
    assert "no records" in run("db", "show", "--path", str(path), "--spec", "nope")
    assert "would remove" in run("db", "prune", "--path", str(path), "--dry-run")
    assert len(db.records()) == 2
    assert "removed 1" in run("db", "prune", "--path", str(path))
    run("db", "export", str(tmp_path / "x.json"), "--path", str(path))
    assert len(TuningDB(tmp_path / "x.json", shipped=False).records()) == 1
    assert "removed 1" in run("db", "prune", "--path", str(path), "--spec", "w4a16_test")

"""The Ray backend (runtime/tune_ray.py), on the CPU: a local Ray with two
fake GPUs (Ray resources only; each task still gets its CUDA_VISIBLE_DEVICES)
runs the real tune_task with the fake timer of tune_pool_fakes.  Skipped
without Ray (pip install 'opgen[ray]')."""
import os
import sys
from pathlib import Path

import pytest

from opgen.codegen.errors import UserError
from opgen.runtime import tune_ray, tuner, tuning_db
from opgen.runtime.tune_pool import tune_pairs
from opgen.runtime.tune_ray import RayWorkers
from opgen.runtime.tuning_db import DBKey, TuningDB

from compile_fakes import FakeConfig, fake_spec
from tune_pool_fakes import DIE, FakeTuner

A, B = "Fake GPU A", "Fake GPU B"
PAIRS = [(fake_spec("w4_fake"), 1024, 1024), (fake_spec("w4_fake"), 2048, 1024),
         (fake_spec("w5_fake"), 1024, 1024)]


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray")
    here = str(Path(__file__).parent)           # where Ray's workers import the fakes from
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([here, *sys.path])}})
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def fake_hash(monkeypatch):
    # the driver's resume check, as the workers' fakes see records and candidates
    monkeypatch.setattr(tuning_db, "rendered_hash", lambda key, config: f"src-{config['name']}")
    monkeypatch.setattr(tuner, "_candidates", lambda spec, arch, M, N, K: [FakeConfig("a"), FakeConfig("b")])


def run(pairs, db, **kw):
    return tune_pairs(pairs, RayWorkers(tune=FakeTuner()), Ms=[1, 16], db=db, progress=False,
                      **kw)


def test_pairs_as_ray_tasks_on_two_gpus(ray, tmp_path):
    db = tmp_path / "db.json"
    first = run(PAIRS, db)
    assert all(o.results.ok() and len(o.results) == 2 for o in first.outcomes)
    # Ray gave each task one GPU: its records are keyed by that GPU's device
    assert all(o.worker.endswith(("gpu0", "gpu1")) and o.device in (A, B) for o in first.outcomes)
    for e in TuningDB(db, shipped=False).records():
        key = DBKey.parse(e.key)
        assert e.record["config_name"] == ("a" if key.device == A else "b")
    assert len(TuningDB(db, shipped=False).records()) == 6
    # the Ray path resumes too: a pair is skipped by a worker of a device that has it
    again = run(PAIRS, db)
    assert all(o.skipped or o.results.ok() for o in again.outcomes)
    assert all(o.skipped for o in again.outcomes if o.device == first.outcomes[o.task.index].device)


def test_a_dead_ray_worker_loses_only_its_pair(ray, tmp_path):
    got = run([PAIRS[0], (fake_spec(DIE), 1024, 1024), PAIRS[2]], tmp_path / "db.json")
    dead = got.outcomes[1]
    assert dead.failed and "Ray worker died while tuning it" in dead.results.error
    assert got.outcomes[0].results.ok() and got.outcomes[2].results.ok()
    assert len(TuningDB(tmp_path / "db.json", shipped=False).records()) == 4


def test_without_ray_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray: ImportError
    with pytest.raises(UserError, match=r"pip install 'opgen\[ray\]'"):
        tune_ray._ray()

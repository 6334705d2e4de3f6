"""The checkpoint load of `opgen bench --e2e --load-time`
(opgen/bench/e2e_load.py): a model written as a GPTQ v2 checkpoint
directory that opgen's own loader serves whole, timed in a fresh process
(here on the CPU)."""
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from safetensors.torch import load_file  # noqa: E402

from opgen.bench import e2e_load  # noqa: E402
from opgen.bench.e2e_model import build_model, linear_names  # noqa: E402
from opgen.torch import quantized  # noqa: E402
from tiny_llama import TINY  # noqa: E402



def test_the_checkpoint_holds_gptq_v2_tensors(tmp_path, monkeypatch):
    monkeypatch.setattr(e2e_load, "SHARD_BYTES", 200_000)          # several shards
    model = build_model(TINY, "cpu", torch.float16)
    names = linear_names(model)
    out = e2e_load.write_gptq(model, names, TINY, tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and out["bytes"] == index["metadata"]["total_size"]
    tensors = {}
    for f in files:
        tensors.update(load_file(str(tmp_path / f)))
    q = quantized(e2e_load.GPTQ_SPEC, model.get_submodule(names[0]).weight)
    for k, name in e2e_load.GPTQ_NAMES.items():
        assert torch.equal(tensors[f"{names[0]}.{name}"], q[k])
    assert not any(k.endswith(".weight") and k[: -len(".weight")] in names for k in tensors)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"] == e2e_load.GPTQ_CONFIG


def test_a_fresh_process_loads_it_whole(tmp_path):
    model = build_model(TINY, "cpu", torch.float16)
    e2e_load.write_gptq(model, linear_names(model), TINY, tmp_path)
    t = e2e_load.time_load(tmp_path, "cpu")
    assert t["served"] == 14 and t["dequantized"] == 0 and t["unused"] == 0
    assert 0 < t["import_s"] < t["ready_s"] <= t["process_s"] and t["load_s"] > 0


def test_a_failed_load_is_an_error_line(tmp_path):
    t = e2e_load.time_load(tmp_path, "cpu")
    assert t["error"].startswith("the loading process exited 1: ") and "config.json" in t["error"]

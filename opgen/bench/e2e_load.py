"""`opgen bench --e2e --load-time`: how long a quantized checkpoint directory
takes to become a model ready to decode (issue 27: an 8B-shaped one in under
30 s). The bench's model is written as a GPTQ v2 checkpoint (4-bit, group
128: config.json with its quantization_config, sharded safetensors), then a
fresh process loads it with `opgen.hf_checkpoint.load_quantized` and runs one
token through it (its kernels loaded), timing each part:

    python -m opgen.bench.e2e_load DIR DEVICE     # prints the times as JSON

torch, safetensors and transformers are imported when used."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

GPTQ_SPEC = "gptq_v2_w4a16_g128"
GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
               "sym": False, "checkpoint_format": "gptq_v2"}
SHARD_BYTES = 4 << 30          # safetensors files of at most this (as Hugging Face shards)
# The tensor names a GPTQ checkpoint gives opgen's stored tensors.
GPTQ_NAMES = {"qweight": "qweight", "scales": "scales", "zeros": "qzeros"}


def write_gptq(model, names: List[str], config: dict, path: Path) -> Dict[str, float]:
    """model (its linear layers `names` quantized to GPTQ v2 where they lie,
    the other tensors as they are) as a checkpoint directory at path:
    {"bytes", "write_s"}."""
    import torch
    from safetensors.torch import save_file
    from ..torch import quantized
    t0 = time.perf_counter()
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)          # as transformers saves a tied head
    for name in names:
        w = tensors.pop(name + ".weight")
        for k, v in quantized(GPTQ_SPEC, w).items():
            tensors[f"{name}.{GPTQ_NAMES[k]}"] = v
    tensors = {k: v.contiguous().cpu() for k, v in tensors.items()}
    shards: List[Dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(tensors):
        n = tensors[k].numel() * tensors[k].element_size()
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][k] = tensors[k]
        size += n
    weight_map = {}
    for i, part in enumerate(shards):
        f = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(part, str(path / f))
        weight_map.update({k: f for k in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(dict(config, quantization_config=GPTQ_CONFIG)))
    return {"bytes": total, "write_s": time.perf_counter() - t0}


def time_load(path: Path, device: str) -> Dict[str, float]:
    """Load path in a fresh process (python -m opgen.bench.e2e_load):
    process_s (start to ready, interpreter and imports included) and the
    child's own import_s, load_s, ready_s; or {"error": ...}."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "opgen.bench.e2e_load", str(path), device],
                       capture_output=True, text=True)
    process_s = time.perf_counter() - t0
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the loading process exited {p.returncode}: {tail}"}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return dict(out, process_s=process_s)


def main(argv=None) -> int:
    """The fresh process: imports, load_quantized, one token."""
    path, device = (argv or sys.argv[1:])[:2]
    t0 = time.perf_counter()
    import torch
    from ..hf_checkpoint import load_quantized
    t1 = time.perf_counter()
    model, report = load_quantized(path, device=device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    with torch.no_grad():
        model(input_ids=torch.ones(1, 1, dtype=torch.long, device=device))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t3 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "ready_s": t3 - t0,
                      "served": len(report.served), "dequantized": len(report.dequantized),
                      "unused": len(report.unused)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The outputs of `opgen bench --e2e`: e2e.json, e2e.md and e2e.png, and the
issue's end-to-end targets evaluated on the rows (the one list of them).
Pure Python (matplotlib if installed)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..codegen.files import write_atomic
from .report import markdown_table


def shipped(spec: str) -> str:
    """The variant of spec as opgen's loaders run it by default (siblings
    fused: replace_linear's and load_quantized's `fuse`): the targets read it."""
    return f"opgen:{spec}+fuse"


W4A16 = shipped("w4a16_sym_g128")
PEER_VARIANTS = ("torch_int4", "gemlite_w4")


@dataclass(frozen=True)
class Target:
    """kind 'speedup': the variant's tokens/s over fp16 at the batch >= need;
    'vs_peers': W4A16's tokens/s over the faster peer's >= need; 'step_vs':
    the variant's step time over `of`'s <= need; 'logits': rel_err over
    rel_err_fp32 <= need at every batch measured."""
    label: str
    kind: str
    variant: str
    need: float
    batch: Optional[int] = None
    of: str = W4A16


TARGETS: Tuple[Target, ...] = (
    Target("W4A16 batch 1 >= 2.8x fp16", "speedup", W4A16, 2.8, 1),
    Target("W4A16 batch 16 >= 2.5x fp16", "speedup", W4A16, 2.5, 16),
    Target("W4A16 batch 64 >= 1.5x fp16", "speedup", W4A16, 1.5, 64),
    *(Target(f"W4A16 batch {b} >= 1.3x the faster of torch int4 / gemlite", "vs_peers", W4A16, 1.3, b)
      for b in (1, 16, 64)),
    *(Target(f"{s} batch {b} step <= 1.15x W4A16's", "step_vs", shipped(s), 1.15, b)
      for s in ("bnb_nf4", "mxfp4") for b in (1, 16, 64)),
    Target("W8A8 batch 64 >= 1.6x fp16", "speedup", shipped("w8a8_int8"), 1.6, 64),
    *(Target(f"{s} logits <= 2x the fp16-vs-fp32 difference", "logits", shipped(s), 2.0)
      for s in ("w4a16_sym_g128", "awq_w4a16_g128", "bnb_nf4", "mxfp4", "w8a8_int8")),
)


def _index(rows: Sequence[dict]) -> Dict[Tuple[str, int], dict]:
    return {(r["variant"], r["batch"]): r for r in rows if r.get("error") is None}


LOAD_WITHIN_S = 30.0    # a quantized checkpoint directory to a model ready to decode


def evaluate(rows: Sequence[dict], load: Optional[dict] = None) -> List[dict]:
    """Each target: label, measured (the ratio; for the checkpoint load its
    seconds), need, status (met / missed / not measured)."""
    by = _index(rows)
    have = {(r["variant"], r["batch"]) for r in rows}
    out = []
    for t in TARGETS:
        ratio: Optional[float] = None
        op = "<=" if t.kind in ("step_vs", "logits") else ">="
        r = by.get((t.variant, t.batch))
        if t.kind == "speedup" and r:
            ratio = r.get("speedup")
        elif t.kind == "vs_peers" and r and all((p, t.batch) in have for p in PEER_VARIANTS):
            # against the peers that ran; one with no row yet (a run cut
            # short) leaves the target not measured, one that could not run
            # (an error row: not installed) is left out
            peers = [by[p, t.batch]["tokens_per_s"] for p in PEER_VARIANTS if (p, t.batch) in by]
            if peers and r.get("tokens_per_s"):
                ratio = r["tokens_per_s"] / max(peers)
        elif t.kind == "step_vs" and r and (t.of, t.batch) in by:
            ratio = r["ms_per_step"] / by[t.of, t.batch]["ms_per_step"]
        elif t.kind == "logits":
            got = [x["rel_err"] / x["rel_err_fp32"] for (v, _), x in by.items()
                   if v == t.variant and x.get("rel_err") is not None and x.get("rel_err_fp32")]
            ratio = max(got) if got else None
        if ratio is None:
            status = "not measured"
        else:
            status = "met" if (ratio <= t.need if op == "<=" else ratio >= t.need) else "missed"
        out.append({"target": t.label, "variant": t.variant, "batch": t.batch,
                    "measured": ratio, "need": f"{op} {t.need:g}", "status": status})
    secs = (load or {}).get("process_s")
    out.append({"target": f"GPTQ checkpoint directory to a ready model < {LOAD_WITHIN_S:g} s",
                "variant": None, "batch": None, "measured": secs, "need": f"< {LOAD_WITHIN_S:g} s",
                "status": "not measured" if secs is None else "met" if secs < LOAD_WITHIN_S else "missed"})
    return out


def _f(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def results_table(rows: Sequence[dict]) -> str:
    body = [[r["variant"], r["batch"], _f(r.get("ms_per_step"), ".3f"), _f(r.get("tokens_per_s"), ".0f"),
             _f(r.get("speedup"), ".2f"), _f(r.get("prefill_ms"), ".1f"), _f(r.get("rel_err"), ".2e"),
             _f(r.get("rel_err_fp32"), ".2e"), _f(r.get("agreement"), ".3f"),
             _f(r.get("agreement_fp32"), ".3f"), r.get("error") or ""]
            for r in rows]
    return markdown_table(["variant", "batch", "ms / step", "tokens/s", "vs fp16", "prefill ms",
                           "logits rel err", "fp16 vs fp32", "token agreement", "fp32's agreement",
                           "error"], body)


def speed_table(rows: Sequence[dict]) -> str:
    """Tokens/s (and x fp16) by variant and batch: the README's table."""
    batches = sorted({r["batch"] for r in rows})
    by = {(r["variant"], r["batch"]): r for r in rows}

    def cell(r):
        if r is None or r.get("tokens_per_s") is None:
            err = (r or {}).get("error") or ""
            return "skipped" if err.startswith("skipped:") else "err" if err else "—"
        return f"{r['tokens_per_s']:.0f} ({r['speedup']:.2f}x)" if r.get("speedup") else \
            f"{r['tokens_per_s']:.0f}"
    body = [[v] + [cell(by.get((v, b))) for b in batches]
            for v in dict.fromkeys(r["variant"] for r in rows)]
    return markdown_table(["variant"] + [f"batch {b}: tokens/s (x fp16)" for b in batches], body)


def targets_table(targets: Sequence[dict]) -> str:
    n = {s: sum(t["status"] == s for t in targets) for s in ("met", "missed")}
    body = [[t["target"], _f(t["measured"], ".2f"), t["need"], t["status"]] for t in targets]
    return (f"{n['met']} met, {n['missed']} missed, {len(targets) - n['met'] - n['missed']} not "
            f"measured.\n\n" + markdown_table(["target", "measured", "need", "status"], body))


def load_lines(load: dict) -> List[str]:
    """The checkpoint load's paragraph (e2e_load.py)."""
    if "error" in load:
        return ["## Checkpoint load", "", f"Failed: {load['error']}", ""]
    return ["## Checkpoint load", "",
            f"The model as a {load['format']} checkpoint ({load['bytes'] / 1e9:.2f} GB, written in "
            f"{load['write_s']:.1f} s), loaded by a fresh process (`opgen.hf_checkpoint."
            f"load_quantized`, then one token): ready {load['process_s']:.1f} s after the process "
            f"started (imports {load['import_s']:.1f} s, load {load['load_s']:.1f} s); "
            f"{load['served']} layers on opgen, {load['dequantized']} in float.", ""]


def markdown(results: dict) -> str:
    env, plan, model = results["env"], results["plan"], results["model"]
    lines = [f"# opgen bench --e2e: {env.get('device', '?')}", "",
             f"`{results.get('command', '')}`", "",
             *(["**Partial results: the run had not finished when this was written.**", ""]
               if results.get("complete") is False else []),
             f"Model {plan['model']} ({model['layers']} layers, hidden {model['hidden_size']}, "
             f"intermediate {model['intermediate_size']}, vocab {model['vocab_size']}; random "
             f"weights; lm_head fp16), prompt {plan['prompt']} tokens, {plan['new_tokens']} new "
             f"tokens, greedy, static KV cache, "
             + ("each decode step replayed from a CUDA graph" if plan["graph"] else
                "eager decode steps (no CUDA)")
             + (", compiled by torch.compile (Inductor)" if plan.get("compile") else "") +
             f"; median of {plan['repeats']} runs. torch {env.get('torch', '?')}, transformers "
             f"{env.get('transformers', '?')}, opgen {env.get('opgen', '?')}.", "",
             "logits rel err: max |logits - reference| / max |reference|, teacher-forced on the "
             "reference's tokens, the reference being the same model holding the variant's "
             "dequantized weights in fp16 (the kernels' error alone); fp16 vs fp32: that "
             "reference's own difference from itself computed in fp32; token agreement: the "
             "fraction of positions where the variant's greedy token, given the reference's "
             "tokens before it, is the reference's; fp32's agreement: the same of the reference "
             "computed in fp32 (random weights give nearly flat logits: rounding alone flips "
             "many). no_linear: the linear layers compute nothing (the step's time outside "
             "them).", "",
             "## Results", "", speed_table(results["rows"]), "", results_table(results["rows"]), "",
             *(load_lines(results["load"]) if "load" in results else []),
             "## Targets", "", targets_table(results.get("targets", [])), ""]
    return "\n".join(lines)


def plot(results: dict, out_dir: Path) -> List[str]:
    """e2e.png: tokens/s per variant at each batch (log scale); [] without
    matplotlib or rows."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    rows = [r for r in results["rows"] if r.get("tokens_per_s")]
    if not rows:
        return []
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    by = {(r["variant"], r["batch"]): r["tokens_per_s"] for r in rows}
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(batches) * len(variants) / 3, 4))
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        xs = [j + i * width for j, b in enumerate(batches) if (v, b) in by]
        ys = [by[v, b] for b in batches if (v, b) in by]
        ax.bar(xs, ys, width, label=v)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))])
    ax.set_xticklabels([f"batch {b}" for b in batches])
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"decode, {results['plan']['model']}, {results['env'].get('device', '')}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "e2e.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [str(path)]


def write_outputs(results: dict, out_dir, plots: bool = True) -> List[str]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "e2e.json", json.dumps(results, indent=1) + "\n")
    write_atomic(out_dir / "e2e.md", markdown(results))
    paths = [str(out_dir / "e2e.json"), str(out_dir / "e2e.md")]
    return paths + (plot(results, out_dir) if plots else [])

"""The outputs of `opgen bench`: bench.json, bench.md (the Markdown tables) and
the plots speedup.png / floor.png.  Pure Python (matplotlib if installed)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from opgen.bench.graph import L2_FACTOR, MAX_M, MIN_LAYERS
from opgen.bench.plan import BASELINE, PEER_LABELS, PEERS
from opgen.bench.targets import TARGET_SHAPE
from opgen.codegen.files import write_atomic

# --- Markdown ---------------------------------------------------------------------

def _fmt_us(x) -> str:
    if x is None:
        return "—"
    return f"{x:.2f}" if x < 100 else f"{x:.1f}" if x < 10000 else f"{x:.0f}"


def _fmt_x(x) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _fmt_pct(x) -> str:
    return "—" if x is None else f"{x:.0f}%"


def _verdict(verified) -> str:
    """A row's check cell: ok, WRONG, or — when it was not checked."""
    return {True: "ok", False: "WRONG", None: "—"}[verified]


def markdown_table(headers: List[str], rows: List[List[str]], align: Optional[str] = None) -> str:
    """A Markdown table (align: "l" / "r" per column; `|` in cells escaped)."""
    align = align or "l" * len(headers)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def results_table(rows: Sequence[dict]) -> str:
    """The per-(spec, N, K, M) table."""
    headers = ["spec", "N x K", "M", "opgen µs", "config", "src", "cuBLAS fp16 µs", "speedup",
               "peer", "peer µs", "vs peer", "floor µs", "% floor", "read-only µs", "check"]
    body = []
    for r in rows:
        peer = r.get("relevant_peer")
        if peer:
            pus = r.get(f"{peer}_us")
            peer_us = _fmt_us(pus) if pus is not None else (
                "err" if (r.get("peer_errors") or {}).get(peer) else "—")
        else:
            peer_us = "—"
        opgen = _fmt_us(r.get("opgen_us")) if r.get("opgen_us") is not None else (
            "err" if r.get("error") else "—")
        check = _verdict(r.get("verified"))
        bound = {"memory": " (mem)", "compute": " (mma)"}.get(r.get("bound"), "")
        body.append([r["spec"], f"{r['N']}x{r['K']}", r["M"], opgen, r.get("config") or "—",
                     r.get("source") or "—", _fmt_us(r.get(f"{BASELINE}_us")),
                     _fmt_x(r.get("speedup_vs_cublas_fp16")),
                     PEER_LABELS.get(peer, "—") if peer and peer != BASELINE else "—",
                     peer_us if peer and peer != BASELINE else "—",
                     _fmt_x(r.get("speedup_vs_peer")) if peer and peer != BASELINE else "—",
                     _fmt_us(r.get("floor_us")) + bound, _fmt_pct(r.get("pct_of_floor")),
                     _fmt_us(r.get("read_us")), check])
    return markdown_table(headers, body, "lllrllrrlrrrrrl")


def peers_table(peer_rows: Sequence[dict], peers: Sequence[str] = PEERS) -> str:
    headers = ["N x K", "M"] + [PEER_LABELS[p] + " µs" for p in peers]
    body = []
    for r in peer_rows:
        cells = []
        for p in peers:
            us = r.get(f"{p}_us")
            cells.append(_fmt_us(us) if us is not None else
                         ("err" if (r.get("errors") or {}).get(p) else "—"))
        body.append([f"{r['N']}x{r['K']}", r["M"], *cells])
    return markdown_table(headers, body, "lr" + "r" * len(peers))


def _us_or_err(us, err) -> str:
    return _fmt_us(us) if us is not None else ("err" if err else "—")


def graph_table(rows: Sequence[dict]) -> str:
    """opgen in graph mode (µs per layer), with PDL where that ran, beside
    its isolated time, the byte floor and the peers' graph figures; "" when
    no row has graph mode."""
    rows = [r for r in rows if "opgen_graph_us" in r or "graph_error" in r]
    if not rows:
        return ""
    body = []
    for r in rows:
        peer = r.get("relevant_peer")
        peer = peer if peer and peer != BASELINE else None
        gerr = r.get("peer_graph_errors") or {}
        pdl = r.get("opgen_graph_pdl_us")
        ran_pdl = pdl is not None or "graph_pdl_error" in r
        plain = r.get("opgen_graph_us")
        body.append([r["spec"], f"{r['N']}x{r['K']}", r["M"], r.get("graph_layers") or "—",
                     _us_or_err(plain, r.get("graph_error")),
                     _us_or_err(pdl, r.get("graph_pdl_error")),
                     _fmt_x(pdl / plain if pdl is not None and plain else None),
                     _fmt_us(r.get("opgen_us")), _fmt_x(r.get("graph_x_isolated")),
                     _fmt_us(r.get("bytes_floor_us")), _fmt_x(r.get("graph_x_bytes_floor")),
                     _us_or_err(r.get(f"{BASELINE}_graph_us"), gerr.get(BASELINE)),
                     PEER_LABELS.get(peer, "—") if peer else "—",
                     _us_or_err(r.get(f"{peer}_graph_us"), gerr.get(peer)) if peer else "—",
                     _verdict(r.get("graph_verified")),
                     _verdict(r.get("graph_pdl_verified")) if ran_pdl else "—"])
    return markdown_table(["spec", "N x K", "M", "layers", "graph µs/layer", "PDL µs/layer",
                           "PDL / graph", "isolated µs", "graph / isolated", "byte floor µs",
                           "x byte floor", "cuBLAS fp16 graph µs", "peer", "peer graph µs", "check",
                           "PDL check"], body, "llrrrrrrrrrrlrll")


def peers_graph_table(peer_rows: Sequence[dict], peers: Sequence[str] = PEERS) -> str:
    """Each peer's graph-mode µs per layer beside its isolated µs; "" when
    no peer row has graph mode."""
    peer_rows = [r for r in peer_rows if "graph_errors" in r]
    if not peer_rows:
        return ""
    body = []
    for r in peer_rows:
        cells = []
        for p in peers:
            g = _us_or_err(r.get(f"{p}_graph_us"), (r.get("graph_errors") or {}).get(p))
            i = _us_or_err(r.get(f"{p}_us"), (r.get("errors") or {}).get(p))
            cells.append(f"{g} / {i}")
        Ls = [L for L in (r.get("graph_layers") or {}).values() if L]
        layers = "—" if not Ls else str(min(Ls)) if min(Ls) == max(Ls) else f"{min(Ls)}-{max(Ls)}"
        body.append([f"{r['N']}x{r['K']}", r["M"], layers, *cells])
    headers = ["N x K", "M", "layers"] + [PEER_LABELS[p] + " µs graph / isolated" for p in peers]
    return markdown_table(headers, body, "lrr" + "r" * len(peers))


def _first_errors(rows: Sequence[dict], key: str) -> List[str]:
    """"- PEER: error", the first error of each peer under rows' `key`."""
    seen, out = set(), []
    for p, e in sorted({(p, e) for r in rows for p, e in (r.get(key) or {}).items()}):
        if p not in seen:
            seen.add(p)
            out.append(f"- {PEER_LABELS.get(p, p)}: {e}")
    return out


def linear_table(rows: Sequence[dict]) -> str:
    """opgen's fused linear (quantize + GEMM from fp16 activations) against the
    unfused BMINF W8A8 pipeline; "" when no row has one."""
    rows = [r for r in rows if "opgen_linear_us" in r or "opgen_linear_error" in r]
    if not rows:
        return ""
    body = []
    for r in rows:
        lu = r.get("opgen_linear_us")
        check = _verdict(r.get("linear_verified"))
        body.append([r["spec"], f"{r['N']}x{r['K']}", r["M"],
                     _fmt_us(lu) if lu is not None else "err", _fmt_us(r.get("opgen_us")),
                     _fmt_us(r.get("bminf_w8a8_us")), _fmt_x(r.get("linear_speedup_vs_bminf")),
                     check])
    return markdown_table(["spec", "N x K", "M", "opgen linear µs", "opgen GEMM µs", "BMINF W8A8 µs",
                           "vs BMINF", "check"], body, "llrrrrrl")


def prepare_table(rows: Sequence[dict]) -> str:
    """The one-time move of each weight stored otherwise than its kernels
    read it (MatmulOp.prepare on the GPU); "" when no spec needed one."""
    seen = {}
    for r in rows:
        if "layout" in r:
            seen.setdefault((r["spec"], r["N"], r["K"]), r)
    body = [[spec, f"{N}x{K}", r["layout"], _fmt_us(r.get("prepare_ms"))]
            for (spec, N, K), r in seen.items()]
    return markdown_table(["spec", "N x K", "runs as", "prepare ms"], body, "lllr") if body else ""


def targets_section(targets: Sequence[dict]) -> str:
    """The isolated targets' table, then the graph-mode targets' (if any)."""
    iso = [t for t in targets if t.get("mode", "isolated") == "isolated"]
    graph = [t for t in targets if t.get("mode") == "graph"]
    return _isolated_targets(iso) + (("\n\n" + _graph_targets(graph)) if graph else "")


def _counts(targets: Sequence[dict]) -> str:
    n_met = sum(t["status"] == "met" for t in targets)
    n_missed = sum(t["status"] == "missed" for t in targets)
    return (f"{n_met} met, {n_missed} missed, {len(targets) - n_met - n_missed} not measured / "
            "n/a.")


def _measured(t: dict) -> str:
    if t["ratio"] is None:
        return "—"
    return f"{t['ratio']:.2f}x floor" if t["metric"] == "bytes_floor" else f"{t['ratio']:.2f}x"


def _status(t: dict) -> str:
    return t["status"] + (f" ({t['why']})" if t.get("why") and t["status"] != "met" else "")


def _graph_targets(targets: Sequence[dict]) -> str:
    shapes = ", ".join(dict.fromkeys(f"{t['N']}x{t['K']}" for t in targets))
    head = f"## Graph-mode targets ({shapes}; µs per layer)\n\n"
    if all(t["status"] == "not measured" for t in targets):
        return head + f"Not evaluated: this run has no row at {shapes} for the target specs."
    body = [[t["target"], t["spec"], f"{t['N']}x{t['K']}", "—" if t["M"] is None else t["M"],
             t.get("graph_layers") or "—", _measured(t), f"{t['op']} {t['need']:g}x",
             _fmt_us(t.get("opgen_graph_us")), t.get("graph_launch") or "—",
             _fmt_us(t.get("opgen_us")), _fmt_us(t.get("bytes_floor_us")),
             _fmt_us(t.get("needed_us")), _status(t)]
            for t in targets]
    return head + _counts(targets) + "\n\n" + markdown_table(
        ["target", "spec", "N x K", "M", "layers", "measured", "need", "graph µs/layer",
         "launch", "isolated µs", "byte floor µs", "needed µs", "status"], body,
        "lllrrrrrlrrrl")


def _isolated_targets(targets: Sequence[dict]) -> str:
    body = [[t["target"], t["spec"], "—" if t["M"] is None else t["M"], _measured(t),
             f"{t['op']} {t['need']:g}x", _fmt_us(t.get("opgen_us")), _fmt_us(t.get("needed_us")),
             _fmt_us(t.get("read_us")), _status(t)] for t in targets]
    N, K = (targets[0]["N"], targets[0]["K"]) if targets else TARGET_SHAPE
    if all(t["status"] == "not measured" for t in targets):
        return (f"## Targets (N = {N}, K = {K})\n\nNot evaluated: this run has no row at "
                f"N = {N}, K = {K} for the target specs.")
    head = f"## Targets (N = {N}, K = {K})\n\n{_counts(targets)}\n\n"
    note = ("\n\nneeded µs: the slowest opgen time that meets the target; read-only µs: a "
            "plain streaming read of the row's bytes, timed the same way (memory-bound rows, "
            "M <= 16). Where needed < read-only, the target asks for less time than reading "
            "the weights takes.")
    return head + markdown_table(["target", "spec", "M", "measured", "need", "opgen µs", "needed µs",
                                  "read-only µs", "status"], body, "llrrrrrrl") + note


def markdown(results: dict) -> str:
    env, meas = results.get("env", {}), results.get("measured", {})

    def num(k, unit, nd=1):
        v = meas.get(k)
        return f"{v:.{nd}f} {unit}" if v else "not measured"

    lines = [f"# opgen bench: {env.get('device', '?')}", ""]
    lines.append(f"`{results.get('command', '')}`")
    lines.append("")
    if results.get("complete") is False:
        lines += ["**Partial results: the run had not finished when this was written.**", ""]
    lines.append(f"torch {env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')}), "
                 f"cupy {env.get('cupy', '?')}, NVRTC {env.get('nvrtc', '?')}, "
                 f"opgen {env.get('opgen', '?')}, {results.get('started_at', '')}")
    lines.append("")
    lines.append(f"Measured in this run: copy {num('copy_tbps', 'TB/s', 2)} (device-to-device, "
                 f"read + write), fp16 {num('fp16_tflops', 'TFLOP/s')}, "
                 f"int8 {num('int8_tops', 'TOP/s')}, fp8 {num('fp8_tflops', 'TFLOP/s')} "
                 "(cuBLAS at 8192^3).  Floor = max(bytes / copy bandwidth, flops / ceiling); "
                 "% floor = floor / opgen time.  All times are medians in µs.")
    lines.append("")
    lines.append("## Results")
    lines.append("")
    lines.append(results_table(results.get("rows", [])))
    lin = linear_table(results.get("rows", []))
    if lin:
        lines += ["", "## Fused linear from fp16 activations", "",
                  "opgen's quantize kernel + GEMM with both scales fused (`opgen.runtime.op."
                  "load_linear`), against the unfused BMINF pipeline (per-row quantize in torch "
                  "ops, `torch._int_mm`, scaling); the GEMM column is opgen on pre-quantized "
                  "activations. `torch._int_mm` needs M > 16, so below that it (and BMINF) run "
                  "on 17 rows, the padding a caller must add.", "", lin]
    peers = results.get("peers") or PEERS
    graphs = graph_table(results.get("rows", []))
    peer_graphs = peers_graph_table(results.get("peer_rows", []), peers)
    if graphs or peer_graphs:
        lines += ["", "## Graph mode (L layers back to back, one CUDA graph)", "",
                  "As a decode step runs them: L distinct layers of the row's shape, each with "
                  f"its own weights (L >= {MIN_LAYERS} and their weights together over "
                  f"{L2_FACTOR}x the L2, fewer only where the memory cap allows no more), each "
                  "reading its own activation, captured once into one CUDA graph and replayed "
                  "under CUDA events; µs per layer = median replay / L. Isolated: the Results "
                  f"figure. Rows with M <= {MAX_M}. check: the graph's outputs after one replay "
                  "against an eager run of the same layers. PDL (sm_90+, unless --no-pdl): the "
                  "same layers with kernels built for programmatic dependent launch (each starts "
                  "under the previous one's tail, its weights prefetched before it waits), "
                  "captured, timed and checked the same way."]
        if graphs:
            lines += ["", graphs]
        if peer_graphs:
            lines += ["", "Peers in graph mode (captured by torch.cuda.CUDAGraph; the layer "
                      "count follows each peer's weight size):", "", peer_graphs]
            errs = _first_errors(results.get("peer_rows", []), "graph_errors")
            if errs:
                lines += ["", "Peers that could not be timed in a graph (first error of each):",
                          ""] + errs
    prep = prepare_table(results.get("rows", []))
    if prep:
        lines += ["", "## Execution layouts", "",
                  "Specs stored otherwise than their kernels read them run as their execution "
                  "spec (`opgen.load` picks it; the rows above are timed on it): the weight is "
                  "moved there once, at load, by `op.prepare` (`codegen/transcode.py`, bit-exact). "
                  "Its time on the GPU, whole layer, median of 5:", "", prep]
    if results.get("peer_rows"):
        lines += ["", "## Peers", "", peers_table(results["peer_rows"], peers)]
        errs = _first_errors(results["peer_rows"], "errors")
        if errs:
            lines += ["", "Peer errors (first of each):", ""] + errs
    problems = []
    for r in results.get("rows", []):
        where = f"- {r['spec']} {r['N']}x{r['K']} M={r['M']}"
        if r.get("error"):
            problems.append(f"{where}: {r['error']}")
        elif r.get("verified") is False:
            problems.append(f"{where}: output check failed ({r.get('verify_msg', '')})")
        if r.get("opgen_linear_error"):
            problems.append(f"{where}, fused linear: {r['opgen_linear_error']}")
        elif r.get("linear_verified") is False:
            problems.append(f"{where}, fused linear: output check failed")
        if r.get("graph_error"):
            problems.append(f"{where}, graph mode: {r['graph_error']}")
        elif r.get("graph_verified") is False:
            problems.append(f"{where}, graph mode: output check failed "
                            f"({r.get('graph_verify_msg', '')})")
        if r.get("graph_pdl_error"):
            problems.append(f"{where}, graph mode with PDL: {r['graph_pdl_error']}")
        elif r.get("graph_pdl_verified") is False:
            problems.append(f"{where}, graph mode with PDL: output check failed "
                            f"({r.get('graph_pdl_verify_msg', '')})")
    if problems:
        lines += ["", "## Problems", ""] + problems
    if results.get("targets") is not None:
        lines += ["", targets_section(results["targets"])]
    return "\n".join(lines) + "\n"


# --- plots ------------------------------------------------------------------------

# One style per spec: 18 colours (tab10, then 8 darker or brighter ones) against
# 7 markers (coprime lengths: no (colour, marker) pair repeats within 126
# specs), and a second line style once the colours come round, so two specs
# never share both colour and marker.
PLOT_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#000080", "#808000", "#800000",
                "#008080", "#ffd700", "#00ff00", "#ff00ff")
PLOT_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
PLOT_LINESTYLES = ("-", "--", "-.")


def plot_styles(specs: Sequence[str]) -> dict:
    """{spec: (colour, marker, linestyle)}: the i-th spec name in sorted order
    takes entry i of the cycle, so a spec keeps its style in every panel and
    in both plots, whatever order the rows come in."""
    out = {}
    for i, s in enumerate(sorted(set(specs))):
        out[s] = (PLOT_COLOURS[i % len(PLOT_COLOURS)], PLOT_MARKERS[i % len(PLOT_MARKERS)],
                  PLOT_LINESTYLES[i // len(PLOT_COLOURS) % len(PLOT_LINESTYLES)])
    return out


def plot(results: dict, out_dir: Path) -> List[str]:
    """speedup.png (speedup over cuBLAS fp16 vs M) and floor.png (% of floor vs
    M), one subplot per shape, one line per spec.  [] (with a message) when
    matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        print("opgen bench: matplotlib not installed, no plots", file=sys.stderr)
        return []
    rows = [r for r in results.get("rows", []) if r.get("opgen_us") is not None]
    shapes = list(dict.fromkeys((r["N"], r["K"]) for r in rows))
    if not shapes:
        return []
    styles = plot_styles([r["spec"] for r in rows])
    written = []
    for fname, key, ylabel, ref in (
            ("speedup.png", "speedup_vs_cublas_fp16", "speedup over cuBLAS fp16 (x)", 1.0),
            ("floor.png", "pct_of_floor", "% of memory/compute floor", 100.0)):
        ncol = min(len(shapes), 3)
        nrow = -(-len(shapes) // ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(6.5 * ncol, 4.5 * nrow), squeeze=False)
        for ax, (N, K) in zip(axes.flat, shapes):
            for s in sorted({r["spec"] for r in rows if (r["N"], r["K"]) == (N, K)}):
                pts = sorted((r["M"], r[key]) for r in rows
                             if (r["N"], r["K"], r["spec"]) == (N, K, s) and r.get(key) is not None)
                if pts:
                    colour, marker, line = styles[s]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, marker=marker,
                            linestyle=line, markersize=5, label=s)
            ax.axhline(ref, color="gray", linestyle="--", linewidth=1)
            ax.set_xscale("log", base=2)
            ms = sorted({r["M"] for r in rows if (r["N"], r["K"]) == (N, K)})
            ax.set_xticks(ms)
            ax.set_xticklabels([str(m) for m in ms])
            ax.minorticks_off()
            if key == "speedup_vs_cublas_fp16":
                ax.set_yscale("log", base=2)
            ax.set_title(f"N={N}, K={K}")
            ax.set_xlabel("M (tokens)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        for ax in list(axes.flat)[len(shapes):]:
            ax.set_visible(False)
        # One legend for all panels (a spec has one style everywhere), outside them.
        handles = [Line2D([], [], color=c, marker=m, linestyle=ls, markersize=5)
                   for c, m, ls in styles.values()]
        fig.suptitle(f"opgen on {results.get('env', {}).get('device', '?')}")
        fig.tight_layout()
        fig.legend(handles, list(styles), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
        path = Path(out_dir) / fname
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(str(path))
    return written


def _json_default(x):
    item = getattr(x, "item", None)          # numpy scalars
    return item() if callable(item) else str(x)


def write_outputs(results: dict, out_dir, plots: bool = True) -> List[str]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "bench.json", json.dumps(results, indent=1, default=_json_default) + "\n")
    write_atomic(out_dir / "bench.md", markdown(results))
    paths = [str(out_dir / "bench.json"), str(out_dir / "bench.md")]
    if plots:
        paths += plot(results, out_dir)
    return paths

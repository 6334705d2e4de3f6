"""`opgen bench`'s outputs (opgen/bench/report.py): bench.json, the
Markdown report (with graph mode's tables), the plots."""
import json

from bench_fakes import MEAS, SYNTH, spec
from opgen.bench.plan import PEERS, shipped_matmul_specs
from opgen.bench.report import (PLOT_COLOURS, graph_table, linear_table, markdown,
                                peers_graph_table, plot_styles, prepare_table, results_table,
                                write_outputs)
from opgen.bench.roofline import finish_row
from opgen.bench.targets import evaluate_targets


def _results():
    rows = []
    for r in SYNTH:
        r = dict(r)
        r.setdefault("config", "gemv_m1_w4_v16_s8")
        r.setdefault("source", "heuristic")
        r["verified"] = True if r.get("opgen_us") else None
        rows.append(finish_row(r, spec(r["spec"]), MEAS))
    rows[2]["verified"] = False
    rows[2]["verify_msg"] = "relative error 1.0e+00 > 4.0e-03"
    return {"command": "opgen bench --quick", "env": {"device": "NVIDIA H200", "torch": "2.11"},
            "measured": MEAS, "rows": rows,
            "peer_rows": [{"N": 8192, "K": 8192, "M": 1, "cublas_fp16_us": 50.0,
                           "errors": {"int_mm": "RuntimeError: M must be > 16"}}],
            "peers": list(PEERS), "targets": evaluate_targets(SYNTH)}


def test_markdown():
    res = _results()
    md = markdown(res)
    assert md.startswith("# opgen bench: NVIDIA H200")
    assert "`opgen bench --quick`" in md and "4.00 TB/s" in md and "800.0 TFLOP/s" in md
    table = results_table(res["rows"]).splitlines()
    assert len(table) == 2 + len(res["rows"])
    assert table[0].startswith("| spec | N x K | M | opgen µs |")
    assert all(line.count("|") == table[0].count("|") for line in table)
    first = table[2]
    assert "gptq_v2_w4a16_g128" in first and "8192x8192" in first and "10.00" in first
    assert "| 5.00x | tinygemm int4 | 15.00 | 1.50x |" in first
    assert "WRONG" in table[4]                     # the row that failed its check
    assert "| err |" in table[-1]                  # mxfp4: opgen failed
    assert "## Targets (N = 8192, K = 8192)" in md
    # opgen µs, the slowest time that meets the target (50 / 4.5), no read-only time in SYNTH
    assert ("| W4A16 g128 M=1 vs cuBLAS fp16 | gptq_v2_w4a16_g128 | 1 | 5.00x | >= 4.5x | 10.00 | "
            "11.11 | — | met |") in md
    assert "| W2A16 M=1 within 1.4x of byte floor | w2a16_g128 | 1 | 1.40x floor | <= 1.4x |" in md
    assert "missed" in md and "## Problems" in md and "CompileError: boom" in md
    assert "## Peers" in md and "torch._int_mm: RuntimeError: M must be > 16" in md
    w8 = [r for r in res["rows"] if r["spec"] == "w8a8_int8" and r["M"] == 64][0]
    assert w8["linear_speedup_vs_bminf"] == 2.0
    assert "## Fused linear from fp16 activations" in md
    assert "| w8a8_int8 | 8192x8192 | 64 | 15.00 | 10.00 | 30.00 | 2.00x | ok |" in md
    assert linear_table([r for r in res["rows"] if r["spec"] != "w8a8_int8"]) == ""


def test_write_outputs(tmp_path, capsys):
    res = _results()
    paths = write_outputs(res, tmp_path / "out", plots=True)
    assert str(tmp_path / "out" / "bench.json") in paths
    back = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert back["rows"][0]["spec"] == "gptq_v2_w4a16_g128"
    assert (tmp_path / "out" / "bench.md").read_text() == markdown(res)
    try:
        import matplotlib
        assert matplotlib
    except ImportError:
        assert "matplotlib not installed" in capsys.readouterr().err
        assert not any(p.endswith(".png") for p in paths)
    else:
        assert (tmp_path / "out" / "speedup.png").exists() and (tmp_path / "out" / "floor.png").exists()


def test_plot_styles_tell_specs_apart():
    """Every spec's line has its own colour and marker (more specs than the
    10 default colours), and the same style in any order the rows come in."""
    names = [f"spec{i:02d}" for i in range(40)] + list(shipped_matmul_specs())
    styles = plot_styles(names)
    assert len(styles) == len(set(names))
    assert len({(c, m) for c, m, _ in styles.values()}) == len(styles)
    assert plot_styles(list(reversed(names))) == styles
    shipped = plot_styles(shipped_matmul_specs())
    assert len({c for c, _, _ in shipped.values()}) == min(len(shipped), len(PLOT_COLOURS))
    assert len({m for _, m, _ in shipped.values()}) > 1


def test_execution_layouts_section():
    """Rows timed in the kernels' layout say so, and the one-time move's time
    is listed once per (spec, shape)."""
    res = _results()
    assert "## Execution layouts" not in markdown(res)
    for r in res["rows"]:
        if r["spec"] == "gptq_v2_w4a16_g128":
            r.update(layout="gptq_v2_w4a16_g128_exec", prepare_ms=1.25)
    table = prepare_table(res["rows"]).splitlines()
    assert table[0] == "| spec | N x K | runs as | prepare ms |"
    assert len(table) == 2 + len({(r["N"], r["K"]) for r in res["rows"] if "layout" in r})
    assert "| gptq_v2_w4a16_g128 | 8192x8192 | gptq_v2_w4a16_g128_exec | 1.25 |" in table
    assert "## Execution layouts" in markdown(res)


def test_graph_mode_tables():
    """Graph mode: opgen's per-layer figure (plain and with PDL) beside the
    isolated one, the floor and the peers' graph figures; the peers' own
    table; failures under Problems and per peer; the graph targets' section
    (on the faster launch)."""
    res = _results()
    assert graph_table(res["rows"]) == "" and "## Graph mode" not in markdown(res)
    w4, nf4 = res["rows"][1], res["rows"][6]
    assert (w4["spec"], nf4["spec"]) == ("w4a16_sym_g128", "bnb_nf4")
    w4.update(opgen_graph_us=9.0, graph_layers=18, graph_verified=True, cublas_fp16_graph_us=40.0,
              tinygemm_int4_graph_us=None, peer_graph_errors={"tinygemm_int4": "capture: boom"},
              opgen_graph_pdl_us=7.2, graph_pdl_verified=True)
    nf4.update(graph_error="capture: RuntimeError: not permitted", graph_layers=16,
               graph_pdl_error="capture: PdlLaunchError: refused")
    res["rows"][2].update(opgen_graph_us=12.0, graph_layers=16, graph_verified=False,
                          graph_verify_msg="graph differs from the eager run",
                          opgen_graph_pdl_us=11.0, graph_pdl_verified=False,
                          graph_pdl_verify_msg="graph differs from the eager run")
    res["rows"] = [finish_row(r, spec(r["spec"]), MEAS) for r in res["rows"]]
    res["peer_rows"][0].update(cublas_fp16_graph_us=40.0, cublas_bf16_graph_us=41.0,
                               graph_layers={"cublas_fp16": 16, "cublas_bf16": 16,
                                             "tinygemm_int4": 0},
                               graph_errors={"tinygemm_int4": "capture: boom"})
    res["targets"] = evaluate_targets(res["rows"])
    table = graph_table(res["rows"]).splitlines()
    assert table[0] == ("| spec | N x K | M | layers | graph µs/layer | PDL µs/layer | PDL / graph | "
                        "isolated µs | graph / isolated | byte floor µs | x byte floor | "
                        "cuBLAS fp16 graph µs | peer | peer graph µs | check | PDL check |")
    assert len(table) == 2 + 3
    floor = w4["bytes_floor_us"]
    assert table[2] == (f"| w4a16_sym_g128 | 8192x8192 | 1 | 18 | 9.00 | 7.20 | 0.80x | 11.00 | "
                        f"0.82x | {floor:.2f} | {9.0 / floor:.2f}x | 40.00 | tinygemm int4 | err | "
                        "ok | ok |")
    assert table[3].endswith("| WRONG | WRONG |")
    assert "| bnb_nf4 | 8192x8192 | 1 | 16 | err | err | — |" in table[4]
    peers = peers_graph_table(res["peer_rows"]).splitlines()
    assert peers[0].startswith("| N x K | M | layers | cuBLAS fp16 µs graph / isolated |")
    assert "| 8192x8192 | 1 | 16 | 40.00 / 50.00 | 41.00 / — | err / — |" in peers[2]
    md = markdown(res)
    assert "## Graph mode (L layers back to back, one CUDA graph)" in md
    assert "- tinygemm int4: capture: boom" in md
    assert "- bnb_nf4 8192x8192 M=1, graph mode: capture: RuntimeError: not permitted" in md
    assert "- bnb_nf4 8192x8192 M=1, graph mode with PDL: capture: PdlLaunchError: refused" in md
    assert ("- gptq_v2_w4a16_g128 8192x8192 M=16, graph mode: output check failed (graph "
            "differs from the eager run)") in md
    assert ("- gptq_v2_w4a16_g128 8192x8192 M=16, graph mode with PDL: output check failed "
            "(graph differs from the eager run)") in md
    assert "## Graph-mode targets (8192x8192, 28672x8192; µs per layer)" in md
    # the target holds the faster launch: PDL's 7.2 µs here
    assert "| graph: W4A16 g128, NF4, MXFP4 M=1 within 1.2x of byte floor | w4a16_sym_g128 | " \
           f"8192x8192 | 1 | 18 | {7.2 / floor:.2f}x floor | <= 1.2x | 7.20 | pdl | 11.00 |" in md
    # the isolated targets' section is as it was
    assert "## Targets (N = 8192, K = 8192)" in md

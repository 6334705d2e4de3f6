"""`opgen bench`'s outputs (opgen/bench/report.py): bench.json, the
Markdown report, the plots."""
import json

from bench_fakes import MEAS, SYNTH, spec
from opgen.bench.plan import PEERS, shipped_matmul_specs
from opgen.bench.report import (PLOT_COLOURS, linear_table, markdown, plot_styles, prepare_table,
                                results_table, write_outputs)
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

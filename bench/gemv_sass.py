"""SASS cost of the GEMV hot loop, on the CPU (NVRTC + nvdisasm, no GPU).

    python bench/gemv_sass.py [spec ...] [--M 1] [--N 8192] [--K 8192] [--arch sm_90]
                              [--config gemv_m1_w8_v16_s4]

For the heuristic's pick (or --config): registers and spills from ptxas, then
the loop of the SASS that issues the most weight loads. The weight loads are
the 16/8/4-byte global loads (`LDG.E[.128|.64]`, .CONSTANT or not) minus the
activation loads, told apart here by counting weight vectors from the source
side: weights per loop trip = weight loads x vector elements. Prints
instructions per trip, per 16-byte weight vector and per weight, by class.
wgmma configs (the rs GEMM's, e.g. --M 16 --config gemm_16x64x128_w64x16_p12_s1_wg_tma_rs4):
the loop with the most wgmma instead, its instructions per 128 k (k16 a
HGMMA, k32 an IGMMA or QGMMA), by class.
"""
from __future__ import annotations

import argparse
import re
from collections import Counter

from opgen.codegen import planner
from opgen.codegen.lower import vector, weight_layout
from opgen.codegen.resolve import load_spec, shipped_specs
from opgen.codegen import compiler

DEFAULT = ["gptq_v2_w4a16_g128", "awq_w4a16_g128", "w4a16_sym_g128", "bnb_nf4", "mxfp4",
           "w2a16_g128", "bitnet_b158"]
INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL = re.compile(r"^\.(L_x_\d+):")


def parse(sass: str):
    """[(addr, opcode, operands)] in program order and {label: index}."""
    out, labels = [], {}
    for line in sass.splitlines():
        m = LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(out)
            continue
        m = INS.search(line)
        if m:
            out.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out, labels


def loops(ins, labels):
    """(start, end) index ranges closed by a backward branch."""
    res = []
    for i, (_, op, args) in enumerate(ins):
        if op.startswith("BRA"):
            m = re.search(r"\(\.(L_x_\d+)\)", args)
            if m and labels.get(m.group(1), i + 1) <= i:
                res.append((labels[m.group(1)], i))
    return res


def weight_loads(ins, vbytes: int, streamed: bool):
    """Indices of weight-vector loads: the no-allocate (.NA / .EF) loads when the
    kernel streams its weights, else every load of the vector's width."""
    width = {16: ".128", 8: ".64", 4: ""}[vbytes]
    out = []
    for i, (_, op, _) in enumerate(ins):
        if not op.startswith("LDG"):
            continue
        w = ".128" if ".128" in op else ".64" if ".64" in op else "" if not re.search(r"\.(U|S)(8|16)", op) else "x"
        if w != width:
            continue
        if streamed and not re.search(r"\.(NA|EF|LU)\b", op):
            continue
        out.append(i)
    return out


CLASSES = [("mem.global", r"^LDG"), ("mem.shared", r"^(LDS|STS|ATOMS)"), ("hfma2/hadd2/hmul2", r"^H(FMA2|ADD2|MUL2)"),
           ("lop3", r"^LOP3"), ("shift", r"^SHF"), ("prmt", r"^PRMT"), ("ffma/fadd/fmul", r"^F(FMA|ADD|MUL)\b"),
           ("cvt", r"^(F2F|I2F|F2FP|F2I|HADD2\.F32|I2FP)"), ("int addr", r"^(IMAD|IADD3|LEA|ISETP|MOV|SEL|IABS)"),
           ("branch", r"^(BRA|BSYNC|BSSY|EXIT)")]


def classify(op: str) -> str:
    if op.startswith("HADD2.F32"):
        return "cvt"
    for name, rx in CLASSES:
        if re.match(rx, op):
            return name
    return "other"


WGMMA_K = {"HGMMA": 16, "IGMMA": 32, "QGMMA": 32}      # k of one wgmma (16- / 8-bit operands)


def mma_loop(ins, labels, row: dict) -> dict:
    """The loop issuing the most wgmma: instructions per trip and per 128 k,
    and per 128 k by class."""
    best = None
    for (a, b) in loops(ins, labels):
        k = sum(WGMMA_K.get(op.split(".")[0], 0) for _, op, _ in ins[a:b + 1])
        if k and (best is None or k > best[2]):
            best = (a, b, k)
    if best is None:
        return dict(row, loop="none")
    a, b, k = best
    body = ins[a:b + 1]
    per = 128 / k
    cls = Counter(classify(op) for _, op, _ in body)
    return dict(row, loop_ins=len(body), k=k, per_128k=round(len(body) * per),
                classes={c: round(v * per) for c, v in cls.most_common()})


def report(name: str, M: int, N: int, K: int, arch: str, config: str | None = None) -> dict:
    s = load_spec(shipped_specs()[name])
    if config:
        cfg = next(c for c in planner.all_configs() if c.name == config)
    else:
        cfg = planner.heuristic(s, arch, M, N, K)
    c = compiler.compile_kernel(s, cfg, arch)
    ins, labels = parse(compiler.disassemble(c.cubin))
    row = dict(spec=name, config=cfg.name, **{k: c.resources.get(k) for k in ("registers", "spill_bytes")})
    if cfg.wgmma:
        return mma_loop(ins, labels, row)
    vec = vector(weight_layout(s), cfg.vbytes)
    per_vec = vec.nrows * vec.ncols
    streamed = "ldg16_stream" in c.source or "ldg4_stream" in c.source
    wl = set(weight_loads(ins, cfg.vbytes, streamed))
    best = None
    for (a, b) in loops(ins, labels):
        n = sum(1 for i in wl if a <= i <= b)
        if n and (best is None or n > best[2] or (n == best[2] and b - a < best[1] - best[0])):
            best = (a, b, n)
    if best is None:
        row.update(loop="none")
        return row
    a, b, n = best
    if not streamed and vec.k_extent % 8 == 0 and weight_layout(s).row_axis == "n":
        # v0 row kernel: its activation loads are 16-byte too (k_extent / 8 per row m).
        n = n // (1 + cfg.mmax * vec.k_extent // 8)
    body = ins[a:b + 1]
    weights = n * per_vec
    cls = Counter(classify(op) for _, op, _ in body)
    row.update(loop_ins=len(body), weight_loads=n, weights=weights,
               per_16B=round(len(body) / (weights * cfg.vbytes / per_vec / 16), 1),
               per_weight=round(len(body) / weights, 2),
               classes={k: round(v / weights, 3) for k, v in cls.most_common()})
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="*", default=DEFAULT)
    ap.add_argument("--M", type=int, default=1)
    ap.add_argument("--N", type=int, default=8192)
    ap.add_argument("--K", type=int, default=8192)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--config")
    a = ap.parse_args(argv)
    for name in a.specs:
        r = report(name, a.M, a.N, a.K, a.arch, a.config)
        cls = r.pop("classes", {})
        print("  ".join(f"{k}={v}" for k, v in r.items()))
        if cls:
            print("    per 128 k:" if "per_128k" in r else "    per weight:", ", ".join(f"{k} {v}" for k, v in cls.items()))


if __name__ == "__main__":
    main()

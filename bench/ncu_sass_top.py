"""The SASS lines a kernel's warps stall on most, from Nsight Compute's
source page (`ncu -i REPORT --page source --csv --print-source sass`, read
on stdin): the top lines by warp stall samples (all reasons together), each
with its share of the kernel's samples and its address.

    ncu -i rep.ncu-rep --page source --csv --print-source sass | python bench/ncu_sass_top.py 40
"""
import csv
import sys


def main() -> int:
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    text = sys.stdin.read().splitlines()
    start = next((i for i, l in enumerate(text) if l.startswith('"') and "Source" in l), None)
    if start is None:
        print("no source table; the first lines were:\n" + "\n".join(text[:8]))
        return 1
    rows = list(csv.DictReader(text[start:]))
    cols = list(rows[0]) if rows else []
    sample_col = next((c for c in cols if "Sampling" in c and "All" in c), None) or \
        next((c for c in cols if "Sampling" in c), None)
    if sample_col is None:
        print("columns: " + ", ".join(cols))
        return 1

    def num(v):
        try:
            return float(str(v).replace(",", ""))
        except ValueError:
            return 0.0
    total = sum(num(r[sample_col]) for r in rows) or 1.0
    print(f"{len(rows)} SASS lines, {total:.0f} samples ({sample_col})")
    src = next((c for c in cols if c.strip('"') == "Source"), cols[1] if len(cols) > 1 else cols[0])
    addr = next((c for c in cols if "Address" in c), cols[0])
    for r in sorted(rows, key=lambda r: -num(r[sample_col]))[:top]:
        print(f"{100 * num(r[sample_col]) / total:5.1f}%  {r[addr]:>8}  {r[src]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

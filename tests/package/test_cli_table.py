"""Plain-text tables (opgen/cli/table.py): columns as wide as their widest
cell, numbers right-aligned and text left-aligned, floats to two places,
None blank, no trailing spaces."""
from opgen.cli.table import format_table


def test_format_table():
    text = format_table(["config", "M", "us"], [["gemv_a", 1, 5.0], ["gemm_bb", 4096, 12.345]])
    assert text.splitlines() == [
        "config      M     us",
        "-------  ----  -----",
        "gemv_a      1   5.00",
        "gemm_bb  4096  12.35",
    ]


def test_none_is_blank_and_mixed_columns_are_text():
    text = format_table(["a", "b", "c"], [[None, "x", 1.5], [2, 3, None]])
    lines = text.splitlines()
    # column a holds a number and None: numeric; b holds text: left-aligned
    assert lines[2] == "   x  1.50"
    assert lines[3] == "2  3"
    assert all(line == line.rstrip() for line in lines)


def test_no_rows():
    assert format_table(["bucket", "us"], []).splitlines() == ["bucket  us", "------  --"]

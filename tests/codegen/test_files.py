"""codegen/files.py: a write either happens whole or not at all."""
import os

import pytest

from opgen.codegen import files


def test_write_atomic_replaces_the_content(tmp_path):
    p = tmp_path / "a.json"
    files.write_atomic(p, "first é")
    assert p.read_text(encoding="utf-8") == "first é"
    assert p.stat().st_mode & 0o777 == 0o666 & ~files._umask()
    p.chmod(0o600)
    files.write_atomic(p, b"\x00second", durable=True)
    assert p.read_bytes() == b"\x00second" and p.stat().st_mode & 0o777 == 0o600   # its mode kept
    assert sorted(os.listdir(tmp_path)) == ["a.json"]                              # no temp file left


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    p = tmp_path / "plan.json"
    files.write_atomic(p, "old")

    def crash(src, dst):
        raise OSError("disk gone")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        files.write_atomic(p, "new")
    assert p.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["plan.json"]

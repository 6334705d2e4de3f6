"""One tuning DB file on disk: what it holds, how it is read (lazily, cached
until the file changes) and how it is written (locked, merged, atomic).

    {"format": "opgen-tuning-db", "version": 1,
     "records": {KEY: {BUCKET_LABEL: RECORD}}}

Safety rules, because several tuners may run at once and a DB can take hours
of GPU time to fill:
  * writes lock PATH.lock (flock), re-read the file under the lock, merge,
    write a temp file in the same directory, fsync it and os.replace it over
    PATH: concurrent writers keep each other's records and a crash never
    leaves a half-written file.  Readers take no lock (replace is atomic).
  * an unreadable file (bad JSON, wrong shape) warns once and reads as empty;
    the next write copies it aside to PATH.corrupt-<timestamp> first.
  * a file of another format or version (or any other JSON file) warns and
    reads as empty, and is never overwritten: writes raise TuningDBError.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Dict, Optional, Tuple

from ..codegen.buckets import bucket_order

FORMAT = "opgen-tuning-db"
VERSION = 1
ENV_VAR = "OPGEN_TUNING_DB"          # the user DB's path (tuning_db.default_path)

Record = Dict[str, object]

_RECORD_ORDER = ("config_name", "M", "config", "median_us", "runner_up_us",
                 "heuristic_us", "measured_at")


class TuningDBError(RuntimeError):
    """A write that would destroy a file we do not understand."""


def record_ok(rec) -> bool:
    return (isinstance(rec, dict) and isinstance(rec.get("config"), dict)
            and isinstance(rec.get("median_us"), (int, float)))


# --- reading ------------------------------------------------------------------

@dataclass
class State:
    kind: str                                # ok | missing | corrupt | foreign
    records: Dict[str, Dict[str, Record]] = field(default_factory=dict)
    detail: str = ""


def parse(text: str) -> State:
    try:
        data = json.loads(text)
    except ValueError as e:
        return State("corrupt", detail=f"not valid JSON ({e})")
    if not isinstance(data, dict):
        return State("corrupt", detail="the top level is not a JSON object")
    fmt, ver = data.get("format"), data.get("version")
    if fmt != FORMAT or ver != VERSION:
        # Another format, a newer opgen's layout, or some unrelated JSON file
        # that OPGEN_TUNING_DB points at by mistake: never ours to rewrite.
        return State("foreign", detail=f"format {fmt!r} version {ver!r}, "
                                        f"expected {FORMAT!r} version {VERSION}")
    records = data.get("records")
    if not isinstance(records, dict):
        return State("corrupt", detail="'records' is not an object")
    for key, per_bucket in records.items():
        if not isinstance(per_bucket, dict):
            return State("corrupt", detail=f"records[{key!r}] is not an object")
        for bucket, rec in per_bucket.items():
            if not record_ok(rec):
                return State("corrupt", detail=f"records[{key!r}][{bucket!r}] lacks "
                                                "a 'config' object or a numeric 'median_us'")
    return State("ok", records)


def read_state(path: Path) -> Tuple[Optional[tuple], State]:
    """(signature, state) of the file now, read through one fd so that the
    signature and the text belong to the same file even during a replace."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            raw = f.read()
    except FileNotFoundError:
        return None, State("missing")
    except OSError as e:
        return None, State("corrupt", detail=f"cannot be read ({e})")
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    try:
        return sig, parse(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return sig, State("corrupt", detail=f"not UTF-8 text ({e})")


_NEVER = object()      # 'not warned yet' (a None signature is a real one)


class DBFile:
    """One DB file, read lazily and cached until its (inode, mtime, size) change."""

    def __init__(self, path: Path, shipped: bool = False):
        self.path = path
        self.shipped = shipped
        self._sig: Optional[tuple] = None
        self._state = State("missing")
        self._warned: object = _NEVER

    def read(self) -> State:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._sig, self._state = None, State("missing")
            return self._state
        except OSError:
            st = None
        if st is not None and self._sig == (st.st_ino, st.st_mtime_ns, st.st_size):
            return self._state
        self._sig, self._state = read_state(self.path)
        self._warn(self._state)
        return self._state

    def _warn(self, state: State) -> None:
        if state.kind not in ("corrupt", "foreign") or self._warned == self._sig:
            return
        self._warned = self._sig
        what = "shipped tuning DB" if self.shipped else "opgen tuning DB"
        if state.kind == "corrupt":
            then = ("" if self.shipped else
                    f"; the next write will copy it aside to {self.path}.corrupt-<timestamp> "
                    "and start a fresh file")
            msg = f"{what} {self.path} is unreadable: {state.detail}. Ignoring it " \
                  f"(heuristic configs are used){then}."
        else:
            msg = f"{what} {self.path} is not a file this opgen understands: {state.detail}. " \
                  "Ignoring it (heuristic configs are used); opgen will not overwrite it, " \
                  f"so pass another path (argument, --db or ${ENV_VAR}) to store tuning results."
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


# --- writing ------------------------------------------------------------------

@contextlib.contextmanager
def locked(path: Path):
    """Exclusive flock on PATH.lock; the lock file stays (removing it would race)."""
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)           # closing releases the lock


def document(records: Dict[str, Dict[str, Record]]) -> dict:
    """The JSON document, ordered for people: keys sorted, buckets by M, the
    record fields in a fixed order."""
    out = {}
    for key in sorted(records):
        per = {}
        for bucket in sorted(records[key], key=lambda b: (bucket_order(b), b)):
            rec = records[key][bucket]
            ordered = {f: rec[f] for f in _RECORD_ORDER if f in rec}
            ordered.update({f: rec[f] for f in sorted(rec) if f not in ordered})
            per[bucket] = ordered
        if per:
            out[key] = per
    return {"format": FORMAT, "version": VERSION, "records": out}


def atomic_write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)    # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # Make the rename itself durable (best effort: not every fs allows it).
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def copy_aside(path: Path) -> Path:
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S.%f")
    backup = path.with_name(f"{path.name}.corrupt-{stamp}")
    with open(path, "rb") as src, open(backup, "xb") as dst:
        dst.write(src.read())
        dst.flush()
        os.fsync(dst.fileno())
    return backup


def update(path: Path, mutate, write_if=lambda result: True):
    """Under the file's lock: read it afresh, mutate(records) -> result, and
    write it back if write_if(result); returns the result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path):
        _, state = read_state(path)          # fresh: another writer may have been here
        if state.kind == "foreign":
            raise TuningDBError(
                f"refusing to write {path}: it is not a file this opgen understands "
                f"({state.detail}); it may belong to a newer opgen or to something else. "
                f"Pass another path (argument, --db or ${ENV_VAR}).")
        if state.kind == "corrupt":
            backup = copy_aside(path)
            warnings.warn(f"opgen tuning DB {path} was unreadable ({state.detail}); "
                          f"copied it to {backup} and started a fresh file.",
                          RuntimeWarning, stacklevel=3)
            state = State("ok")
        result = mutate(state.records)
        if write_if(result):
            atomic_write(path, document(state.records))
    return result

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
    A writer killed between its temp file and the replace leaves the temp
    file behind: the next writer removes it under the lock.
  * records are checked one by one: a bad one (no config, no time, an
    unknown M bucket) is reported and skipped, the others are served; the
    next write copies the file aside to PATH.corrupt-<timestamp> and keeps
    every good record.
  * an unreadable file (bad JSON, a damaged layout) warns once and reads as
    empty; the next write copies it aside the same way and starts afresh.
  * a file of another format or version, or any other JSON (a list, some
    settings file), warns and reads as empty, and is never overwritten:
    writes raise TuningDBError.  So do a file, directory or lock the
    filesystem will not let us read or write (TuningDBError: one line naming
    the path, never a raw OSError).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import stat
import sys
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..codegen.buckets import LABELS, bucket_order
from ..codegen.errors import shorten
from ..codegen.files import write_atomic

FORMAT = "opgen-tuning-db"
# The M bucket labels (codegen.buckets.LABELS) are part of the format: a
# record under a label this opgen does not know is dropped as bad, so a
# change of the labels bumps VERSION (older opgens then leave the file alone).
VERSION = 1
ENV_VAR = "OPGEN_TUNING_DB"          # the user DB's path (tuning_db.default_path)

Record = Dict[str, object]

_RECORD_ORDER = ("config_name", "M", "config", "median_us", "runner_up_us",
                 "heuristic_us", "measured_at", "source_hash", "nvrtc", "opgen")


class TuningDBError(RuntimeError):
    """A DB file that cannot be used: one that is not ours (never
    overwritten) or one the filesystem will not let us read or write.  The
    message is one line naming the path."""


def key_fields(s: str) -> Tuple[str, str, str, str, int, int]:
    """(spec, spec hash, arch, device, N, K) of a stored key
    "spec|hash|arch|device|N<n>|K<k>", or of the old form (which also named
    the opgen and NVRTC versions); ValueError for anything else."""
    parts = s.split("|")
    if len(parts) == 8 and parts[5].startswith("nvrtc"):
        parts = parts[:4] + parts[6:]
    if len(parts) != 6 or not parts[4].startswith("N") or not parts[5].startswith("K"):
        raise ValueError(f"not a tuning DB key: {s!r}")
    try:
        N, K = int(parts[4][1:]), int(parts[5][1:])
    except ValueError:
        raise ValueError(f"not a tuning DB key: {s!r}") from None
    if N < 1 or K < 1:
        raise ValueError(f"not a tuning DB key: {s!r} (N and K must be positive)")
    return parts[0], parts[1], parts[2], parts[3], N, K


def positive_number(x) -> bool:
    """Whether a JSON value is a finite positive number (an integer too large
    for a float is not)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x) and x > 0
    except OverflowError:
        return False


def record_problem(bucket: str, rec) -> Optional[str]:
    """Why a stored record cannot be used, or None when its layout is right
    (whether its config is still current is tuning_db's question)."""
    if bucket not in LABELS:
        return f"unknown M bucket {bucket!r}"
    if not isinstance(rec, dict) or not isinstance(rec.get("config"), dict):
        return "no 'config' object"
    t = rec.get("median_us")
    if not positive_number(t):
        return f"'median_us' is {shorten(repr(t), 40)}, not a positive number"
    h = rec.get("heuristic_us")
    if h is not None and not positive_number(h):
        return f"'heuristic_us' is {shorten(repr(h), 40)}, not a positive number"
    return None


# --- reading ------------------------------------------------------------------

@dataclass
class State:
    kind: str                                # ok | missing | corrupt | foreign | unreadable
    records: Dict[str, Dict[str, Record]] = field(default_factory=dict)
    detail: str = ""
    bad: List[str] = field(default_factory=list)    # "records[KEY][BUCKET]: why", each skipped


def parse(text: str) -> State:
    try:
        data = json.loads(text)
    except ValueError as e:
        return State("corrupt", detail=f"not valid JSON ({e})")
    except RecursionError:
        return State("corrupt", detail="not valid JSON (nested deeper than Python's JSON reader goes)")
    if not isinstance(data, dict):
        # Some other JSON file that the path points at by mistake.
        return State("foreign", detail=f"the top level is a JSON {type(data).__name__}, "
                                       f"not a {FORMAT!r} object")
    fmt, ver = data.get("format"), data.get("version")
    if fmt != FORMAT or type(ver) is not int or ver != VERSION:    # (True == 1.0 == 1)
        # Another format, a newer opgen's layout, or some unrelated settings
        # file: never ours to rewrite.
        return State("foreign", detail=f"format {fmt!r} version {ver!r}, "
                                        f"expected {FORMAT!r} version {VERSION}")
    records = data.get("records")
    if not isinstance(records, dict):
        return State("corrupt", detail="'records' is not an object")
    state = State("ok")
    for key, per_bucket in records.items():
        if not isinstance(per_bucket, dict):
            state.bad.append(f"records[{key!r}]: not an object")
            continue
        try:
            key_fields(key)
        except ValueError as e:
            state.bad.append(f"records[{key!r}]: {e}")
            continue
        for bucket, rec in per_bucket.items():
            why = record_problem(bucket, rec)
            if why is None:
                state.records.setdefault(key, {})[bucket] = rec
            else:
                state.bad.append(f"records[{key!r}][{bucket!r}]: {why}")
    return state


NOT_REGULAR = "not a regular file (a device, a FIFO or a socket)"


def _special(path: Path) -> bool:
    """Whether path is there and neither a regular file nor a directory (a
    directory reads as unreadable: open says why)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def read_state(path: Path) -> Tuple[Optional[tuple], State]:
    """(signature, state) of the file now, read through one fd so that the
    signature and the text belong to the same file even during a replace.
    Anything but a regular file (a device such as /dev/null or /dev/zero, a
    FIFO) is foreign: never read (it may not end), never replaced."""
    if _special(path):
        return None, State("foreign", detail=NOT_REGULAR)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            raw = f.read()
    except FileNotFoundError:
        return None, State("missing")
    except OSError as e:                   # a directory, no permission, an I/O error
        return None, State("unreadable", detail=e.strerror or str(e))
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    try:
        return sig, parse(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return sig, State("corrupt", detail=f"not UTF-8 text ({e})")


def problems(path: Path, state: State, shipped: bool = False) -> List[str]:
    """One line per thing wrong with the file in `state` (none when it is fine)."""
    what = "shipped tuning DB" if shipped else "tuning DB"
    if state.kind == "corrupt":
        then = "" if shipped else (f"; the next write copies it to {path}.corrupt-<timestamp> "
                                   "and starts a fresh file")
        return [f"{what} {path} is unreadable: {state.detail}{then}"]
    if state.kind == "foreign":
        return [f"{what} {path} is not a file this opgen understands ({state.detail}) and is "
                f"never overwritten: pass another path (argument, --db or ${ENV_VAR})"]
    if state.kind == "unreadable":
        return [f"{what} {path} cannot be read: {state.detail}"]
    return [f"{what} {path}: {b}; skipped" for b in state.bad]


_NEVER = object()      # 'not warned yet' (a None signature is a real one)


class DBFile:
    """One DB file, read lazily and cached until its (inode, mtime, size)
    change.  What is wrong with it is warned once per version of the file
    (RuntimeWarning: the op falls back on the heuristic), unless quiet."""

    def __init__(self, path: Path, shipped: bool = False, quiet: bool = False):
        self.path = path
        self.shipped = shipped
        self.quiet = quiet
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

    def problems(self) -> List[str]:
        return problems(self.path, self.read(), self.shipped)

    def _warn(self, state: State) -> None:
        if self.quiet or self._warned == self._sig:
            return
        lines = problems(self.path, state, self.shipped)
        if not lines:
            return
        self._warned = self._sig
        if state.bad:
            then = "" if self.shipped else (f"; the next write keeps the others and copies the "
                                            f"file to {self.path}.corrupt-<timestamp>")
            msg = (f"{len(lines)} bad record(s) skipped (heuristic configs are used for "
                   f"them){then}. First: {lines[0]}")
        else:
            msg = f"{lines[0]}. Ignoring it: heuristic configs are used."
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


# --- writing ------------------------------------------------------------------

@contextlib.contextmanager
def locked(path: Path):
    """Exclusive flock on PATH.lock; the lock file stays (removing it would
    race). A lock another process holds is waited for, said once on stderr
    (a killed holder's lock is released by the kernel; a stopped one's is not)."""
    lock = path.with_name(path.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"opgen: waiting for {lock}: another opgen process is writing the tuning DB",
                  file=sys.stderr, flush=True)
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


def _temp_name(path: Path) -> "re.Pattern[str]":
    """The names atomic_write's temp files of PATH have (tempfile.mkstemp's
    8 random characters between the prefix and the suffix)."""
    return re.compile(re.escape(path.name) + r"\.[a-z0-9_]{8}\.tmp")


def atomic_write(path: Path, doc: dict) -> None:
    """Replace PATH by doc, atomically and durably (codegen.files); call it
    holding PATH's lock (which is what lets the next writer remove a temp
    file a killed one left)."""
    write_atomic(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n", durable=True)


def remove_stale_temps(path: Path) -> int:
    """Remove the temp files of PATH that killed writers left; only under
    PATH's lock (every live writer holds it while its temp file exists)."""
    pattern, n = _temp_name(path), 0
    for p in path.parent.iterdir():
        if pattern.fullmatch(p.name):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                n += 1
    return n


def copy_aside(path: Path) -> Path:
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S.%f")
    backup = path.with_name(f"{path.name}.corrupt-{stamp}")
    with open(path, "rb") as src, open(backup, "xb") as dst:
        dst.write(src.read())
        dst.flush()
        os.fsync(dst.fileno())
    return backup


def _os_error(path: Path, e: OSError) -> TuningDBError:
    where = f" ({e.filename})" if e.filename and str(e.filename) != str(path) else ""
    return TuningDBError(f"cannot write the tuning DB {path}: {e.strerror or e}{where}")


def check_writable(path: Path) -> None:
    """TuningDBError now where a write to path would raise one.  Where the
    file's folder is there: under the lock, as update does, writing nothing.
    Where it is not yet (the first write makes it): nothing is made; the
    nearest folder above it must be one this process can make folders in."""
    real = Path(os.path.realpath(path))
    try:
        if real.parent.is_dir():
            update(path, lambda records: False, write_if=bool)
            return
        above = real.parent
        while not above.exists():        # (realpath: no links left to follow)
            above = above.parent
    except OSError as e:                 # e.g. a name too long, a folder we may not search
        raise _os_error(real, e) from None
    if not above.is_dir():
        raise TuningDBError(f"cannot write the tuning DB {real}: {above} is not a directory")
    if not os.access(above, os.W_OK | os.X_OK):
        raise TuningDBError(f"cannot write the tuning DB {real}: no permission to make "
                            f"folders in {above}")


def update(path: Path, mutate, write_if=lambda result: True):
    """Under the file's lock: read it afresh, mutate(records) -> result, and
    write it back if write_if(result); returns the result.  Every way the
    file cannot be written raises TuningDBError. A symbolic link is
    followed: its target is locked and replaced, the link stays."""
    path = Path(os.path.realpath(path))
    if _special(path):                   # (before the lock: no lock file beside a device)
        raise TuningDBError(f"refusing to write {path}: {NOT_REGULAR}; pass a file path "
                            f"(argument, --db or ${ENV_VAR})")
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError as e:            # a file where a folder of the path should be
            raise TuningDBError(f"cannot write the tuning DB {path}: "
                                f"{e.filename} is not a directory") from None
        with locked(path):
            remove_stale_temps(path)
            _, state = read_state(path)          # fresh: another writer may have been here
            if state.kind == "foreign":
                raise TuningDBError(
                    f"refusing to write {path}: it is not a file this opgen understands "
                    f"({state.detail}); it may belong to a newer opgen or to something else. "
                    f"Pass another path (argument, --db or ${ENV_VAR}).")
            if state.kind == "unreadable":
                raise TuningDBError(f"cannot read the tuning DB {path}: {state.detail}")
            if state.kind != "missing" and not os.access(path, os.W_OK):
                raise TuningDBError(f"cannot write the tuning DB {path}: it is read-only")
            kept = sum(map(len, state.records.values()))
            result = mutate(state.records)
            if write_if(result):
                if state.kind == "corrupt" or state.bad:
                    _keep_damaged(path, state, kept)
                atomic_write(path, document(state.records))
    except OSError as e:
        raise _os_error(path, e) from None
    return result


def _keep_damaged(path: Path, state: State, kept: int) -> None:
    """Before writing over a damaged file: copy it aside, say so."""
    backup = copy_aside(path)
    if state.kind == "corrupt":
        what = f"was unreadable ({state.detail}); copied it to {backup} and started a fresh file"
    else:
        what = (f"had {len(state.bad)} bad record(s) (first: {state.bad[0]}); copied the file "
                f"to {backup} and kept the {kept} good one(s)")
    warnings.warn(f"opgen tuning DB {path} {what}.", RuntimeWarning, stacklevel=4)

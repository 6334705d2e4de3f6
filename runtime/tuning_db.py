"""The tuning database: which tile config won for a (spec, device, N, K, M bucket).

One human-readable JSON file:

    {"format": "opgen-tuning-db", "version": 1,
     "records": {KEY: {BUCKET_LABEL: RECORD}}}

KEY is `str(DBKey)`, e.g.
"gptq_v1_w4a16_g128|3f2a9c...|sm_90|NVIDIA H200|0.1.0|nvrtc12.9|N8192|K8192":
everything that can change which config is fastest (or whether it still
compiles) is in the key, so a new opgen, NVRTC, spec revision or GPU simply
misses and falls back to the heuristic instead of using a stale winner.

RECORD = {"config": dict, "config_name": str, "M": int, "median_us": float,
          "runner_up_us": [float], "heuristic_us": float | None,
          "measured_at": ISO-8601 str, ...}  (extra fields are kept as is).

Where it lives: the `path` argument, else $OPGEN_TUNING_DB, else
$XDG_CACHE_HOME/opgen/tuning.json (~/.cache/opgen/tuning.json).  A read-only
DB shipped in the package (opgen/data/tuned_h200.json) is consulted after it.

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
import copy
import fcntl
import json
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

from ..codegen.buckets import LABELS, bucket_order

FORMAT = "opgen-tuning-db"
VERSION = 1
ENV_VAR = "OPGEN_TUNING_DB"
SHIPPED_FILE = "tuned_h200.json"

Record = Dict[str, object]
KeyLike = Union["DBKey", str]
# predicate(key string, bucket label, record) -> True to remove the record
Predicate = Callable[[str, str, Record], bool]

_RECORD_ORDER = ("config_name", "M", "config", "median_us", "runner_up_us",
                 "heuristic_us", "measured_at")


class TuningDBError(RuntimeError):
    """A write that would destroy a file we do not understand."""


def default_path() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(cache).expanduser() / "opgen" / "tuning.json"


def shipped_path() -> Optional[Path]:
    """The DB shipped inside the package, or None when there is none."""
    try:
        from importlib.resources import files
        p = Path(str(files("opgen") / "data" / SHIPPED_FILE))
    except Exception:     # not importable as a package: nothing shipped
        return None
    return p if p.is_file() else None


def opgen_version() -> str:
    import opgen
    return opgen.__version__


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --- keys ---------------------------------------------------------------------

@dataclass(frozen=True)
class DBKey:
    """What a tuning result depends on.  str() gives the form stored in JSON."""
    spec: str
    spec_hash: str
    arch: str
    device: str
    opgen_version: str
    nvrtc: str
    N: int
    K: int

    def __post_init__(self):
        for name in ("spec", "spec_hash", "arch", "device", "opgen_version", "nvrtc"):
            if "|" in str(getattr(self, name)):
                raise ValueError(f"DBKey.{name} must not contain '|': {getattr(self, name)!r}")

    def __str__(self) -> str:
        return "|".join((self.spec, self.spec_hash, self.arch, self.device,
                         self.opgen_version, f"nvrtc{self.nvrtc}", f"N{self.N}", f"K{self.K}"))

    @classmethod
    def parse(cls, s: str) -> "DBKey":
        parts = s.split("|")
        if (len(parts) != 8 or not parts[5].startswith("nvrtc")
                or not parts[6].startswith("N") or not parts[7].startswith("K")):
            raise ValueError(f"not a tuning DB key: {s!r}")
        try:
            N, K = int(parts[6][1:]), int(parts[7][1:])
        except ValueError:
            raise ValueError(f"not a tuning DB key: {s!r}") from None
        return cls(parts[0], parts[1], parts[2], parts[3], parts[4], parts[5][5:], N, K)


def make_key(spec, N: int, K: int, *, arch: Optional[str] = None,
             device: Optional[str] = None, nvrtc: Optional[str] = None,
             version: Optional[str] = None) -> DBKey:
    """The key for `spec` (a Spec) at N, K.  arch/device/nvrtc default to the
    current GPU (imports opgen.runtime.device, so needs CUDA)."""
    if arch is None or device is None or nvrtc is None:
        from . import device as dev
        arch = arch or dev.current_arch()
        device = device or dev.device_name()
        nvrtc = nvrtc or dev.nvrtc_version()
    return DBKey(spec.name, spec.content_hash(), arch, str(device).replace("|", "/"),
                 version or opgen_version(), str(nvrtc), int(N), int(K))


def make_record(config: dict, median_us: float, *, M: int, runner_up_us=(),
                heuristic_us: Optional[float] = None, config_name: Optional[str] = None,
                **extra) -> Record:
    rec: Record = {"config": dict(config), "M": int(M), "median_us": round(float(median_us), 4),
                   "runner_up_us": [round(float(t), 4) for t in runner_up_us],
                   "heuristic_us": None if heuristic_us is None else round(float(heuristic_us), 4),
                   "measured_at": now_iso()}
    if config_name is not None:
        rec["config_name"] = config_name
    rec.update(extra)
    return rec


def _record_ok(rec) -> bool:
    return (isinstance(rec, dict) and isinstance(rec.get("config"), dict)
            and isinstance(rec.get("median_us"), (int, float)))


# --- reading ------------------------------------------------------------------

@dataclass
class _State:
    kind: str                                # ok | missing | corrupt | foreign
    records: Dict[str, Dict[str, Record]] = field(default_factory=dict)
    detail: str = ""


def _parse(text: str) -> _State:
    try:
        data = json.loads(text)
    except ValueError as e:
        return _State("corrupt", detail=f"not valid JSON ({e})")
    if not isinstance(data, dict):
        return _State("corrupt", detail="the top level is not a JSON object")
    fmt, ver = data.get("format"), data.get("version")
    if fmt != FORMAT or ver != VERSION:
        # Another format, a newer opgen's layout, or some unrelated JSON file
        # that OPGEN_TUNING_DB points at by mistake: never ours to rewrite.
        return _State("foreign", detail=f"format {fmt!r} version {ver!r}, "
                                        f"expected {FORMAT!r} version {VERSION}")
    records = data.get("records")
    if not isinstance(records, dict):
        return _State("corrupt", detail="'records' is not an object")
    for key, per_bucket in records.items():
        if not isinstance(per_bucket, dict):
            return _State("corrupt", detail=f"records[{key!r}] is not an object")
        for bucket, rec in per_bucket.items():
            if not _record_ok(rec):
                return _State("corrupt", detail=f"records[{key!r}][{bucket!r}] lacks "
                                                "a 'config' object or a numeric 'median_us'")
    return _State("ok", records)


def _read_state(path: Path) -> Tuple[Optional[tuple], _State]:
    """(signature, state) of the file now, read through one fd so that the
    signature and the text belong to the same file even during a replace."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            raw = f.read()
    except FileNotFoundError:
        return None, _State("missing")
    except OSError as e:
        return None, _State("corrupt", detail=f"cannot be read ({e})")
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    try:
        return sig, _parse(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return sig, _State("corrupt", detail=f"not UTF-8 text ({e})")


_NEVER = object()      # 'not warned yet' (a None signature is a real one)


class _DBFile:
    """One DB file, read lazily and cached until its (inode, mtime, size) change."""

    def __init__(self, path: Path, shipped: bool = False):
        self.path = path
        self.shipped = shipped
        self._sig: Optional[tuple] = None
        self._state = _State("missing")
        self._warned: object = _NEVER

    def read(self) -> _State:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._sig, self._state = None, _State("missing")
            return self._state
        except OSError:
            st = None
        if st is not None and self._sig == (st.st_ino, st.st_mtime_ns, st.st_size):
            return self._state
        self._sig, self._state = _read_state(self.path)
        self._warn(self._state)
        return self._state

    def _warn(self, state: _State) -> None:
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
def _locked(path: Path):
    """Exclusive flock on PATH.lock; the lock file stays (removing it would race)."""
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)           # closing releases the lock


def _document(records: Dict[str, Dict[str, Record]]) -> dict:
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


def _atomic_write(path: Path, doc: dict) -> None:
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


def _copy_aside(path: Path) -> Path:
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S.%f")
    backup = path.with_name(f"{path.name}.corrupt-{stamp}")
    with open(path, "rb") as src, open(backup, "xb") as dst:
        dst.write(src.read())
        dst.flush()
        os.fsync(dst.fileno())
    return backup


# --- the DB -------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    key: str
    bucket: str
    record: Record
    source: str                # "user" or "shipped"


class TuningDB:
    """The user's DB file, backed by the read-only shipped DB for lookups.

    shipped: True for the package's opgen/data/tuned_h200.json (if present),
    False/None for none, or a path to another read-only DB file.
    """

    def __init__(self, path: Union[str, os.PathLike, None] = None, shipped=True):
        self.path = Path(path).expanduser() if path else default_path()
        self._user = _DBFile(self.path)
        if shipped is True:
            sp = shipped_path()
        elif shipped:
            sp = Path(shipped)
        else:
            sp = None
        self._shipped = _DBFile(sp, shipped=True) if sp is not None else None

    def __repr__(self) -> str:
        sp = self._shipped.path if self._shipped else None
        return f"TuningDB({str(self.path)!r}, shipped={str(sp) if sp else None!r})"

    key = staticmethod(make_key)

    # reads
    def lookup(self, key: KeyLike, bucket: str) -> Optional[Record]:
        """The record for key and bucket: the user file's, else the shipped one's."""
        k = str(key)
        rec = self._user.read().records.get(k, {}).get(bucket)
        if rec is None and self._shipped is not None:
            rec = self._shipped.read().records.get(k, {}).get(bucket)
        return copy.deepcopy(rec)       # callers must not edit the cache

    def lookup_all(self, key: KeyLike) -> Dict[str, Record]:
        """{bucket: record} for key, user records overriding shipped ones."""
        k = str(key)
        out: Dict[str, Record] = {}
        if self._shipped is not None:
            out.update(self._shipped.read().records.get(k, {}))
        out.update(self._user.read().records.get(k, {}))
        return copy.deepcopy(out)

    def records(self, source: str = "user") -> List[Entry]:
        """Every record of the user file ('user'), the shipped DB ('shipped')
        or both ('all'), sorted by key then bucket."""
        files = {"user": [self._user], "shipped": [self._shipped],
                 "all": [self._user, self._shipped]}[source]
        out = []
        for f in files:
            if f is None:
                continue
            src = "shipped" if f.shipped else "user"
            for key, per in f.read().records.items():
                for bucket, rec in per.items():
                    out.append(Entry(key, bucket, copy.deepcopy(rec), src))
        out.sort(key=lambda e: (e.source != "user", e.key, bucket_order(e.bucket), e.bucket))
        return out

    # writes
    def put(self, key: KeyLike, bucket: str, record: Record) -> None:
        self.put_many([(key, bucket, record)])

    def put_many(self, items: Iterable[Tuple[KeyLike, str, Record]]) -> None:
        """Store several records under one lock (one read-merge-replace)."""
        items = [(str(k), b, r) for k, b, r in items]
        for _, bucket, rec in items:
            if bucket not in LABELS:
                raise ValueError(f"unknown M bucket {bucket!r}; known: {', '.join(LABELS)}")
            if not _record_ok(rec):
                raise ValueError("a record needs a 'config' dict and a numeric 'median_us'")

        def merge(records):
            for key, bucket, rec in items:
                records.setdefault(key, {})[bucket] = copy.deepcopy(rec)
            return True
        self._update(merge)

    def prune(self, predicate: Predicate) -> int:
        """Remove the user records for which predicate(key, bucket, record) is
        true; returns how many.  (The shipped DB is read-only.)"""
        def drop(records):
            n = 0
            for key in list(records):
                for bucket in list(records[key]):
                    if predicate(key, bucket, records[key][bucket]):
                        del records[key][bucket]
                        n += 1
                if not records[key]:
                    del records[key]
            return n
        return self._update(drop, write_if=lambda n: n > 0)

    def export(self, path: Union[str, os.PathLike], include_shipped: bool = False) -> int:
        """Write the user records (and the shipped ones under them if asked) to
        a new DB file at `path`; returns the number of records written."""
        merged: Dict[str, Dict[str, Record]] = {}
        sources = ([self._shipped] if include_shipped and self._shipped else []) + [self._user]
        for f in sources:
            for key, per in f.read().records.items():
                merged.setdefault(key, {}).update(per)
        _atomic_write(Path(path).expanduser(), _document(merged))
        return sum(len(per) for per in merged.values())

    def _update(self, mutate, write_if=lambda result: True):
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            _, state = _read_state(path)          # fresh: another writer may have been here
            if state.kind == "foreign":
                raise TuningDBError(
                    f"refusing to write {path}: it is not a file this opgen understands "
                    f"({state.detail}); it may belong to a newer opgen or to something else. "
                    f"Pass another path (argument, --db or ${ENV_VAR}).")
            if state.kind == "corrupt":
                backup = _copy_aside(path)
                warnings.warn(f"opgen tuning DB {path} was unreadable ({state.detail}); "
                              f"copied it to {backup} and started a fresh file.",
                              RuntimeWarning, stacklevel=3)
                state = _State("ok")
            result = mutate(state.records)
            if write_if(result):
                _atomic_write(path, _document(state.records))
        return result


# --- stale records -------------------------------------------------------------

def shipped_spec_hashes() -> Dict[str, str]:
    """{spec name: content hash} of the specs shipped in opgen.specs ({} if the
    spec loader is not available)."""
    try:
        from importlib.resources import files
        from opgen.codegen.validate import load_spec
    except ImportError:
        return {}
    out = {}
    for entry in files("opgen.specs").iterdir():
        if not entry.name.endswith((".yaml", ".yml")):
            continue
        try:
            spec = load_spec(Path(str(entry)))
        except Exception:            # a broken shipped spec is not prune's business
            continue
        if hasattr(spec, "content_hash"):
            out[spec.name] = spec.content_hash()
    return out


def stale(version: Optional[str] = None,
          spec_hashes: Optional[Dict[str, str]] = None) -> Predicate:
    """Predicate: records of another opgen version, or of a shipped spec whose
    content changed since.  Keys that do not parse are kept (not ours to judge)."""
    version = version or opgen_version()
    spec_hashes = shipped_spec_hashes() if spec_hashes is None else spec_hashes

    def pred(key: str, bucket: str, record: Record) -> bool:
        try:
            k = DBKey.parse(key)
        except ValueError:
            return False
        if k.opgen_version != version:
            return True
        h = spec_hashes.get(k.spec)
        return h is not None and h != k.spec_hash
    return pred


# --- tables and the `opgen db` command ---------------------------------------------

def format_table(headers: List[str], rows: List[List[object]]) -> str:
    """A plain-text table; numbers right-aligned."""
    cells = [[("" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)) for v in r]
             for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [bool(rows) and all(isinstance(r[i], (int, float)) or r[i] is None for r in rows)
               for i in range(len(headers))]

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(vals, widths, numeric)).rstrip()
    out = [line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out)


def config_label(record: Record) -> str:
    name = record.get("config_name")
    if name:
        return str(name)
    return ",".join(f"{k}={v}" for k, v in sorted(record.get("config", {}).items()))


def speedup(record: Record) -> Optional[float]:
    h, t = record.get("heuristic_us"), record.get("median_us")
    return h / t if isinstance(h, (int, float)) and t else None


def add_cli(subparsers) -> None:
    """Add `opgen db show|prune|export`; each sets args.func(args) -> exit code."""
    p = subparsers.add_parser("db", help="inspect and maintain the tuning database")
    sub = p.add_subparsers(dest="db_command", metavar="{show,prune,export}")
    sub.required = True

    show = sub.add_parser("show", help="list tuned records")
    show.add_argument("--spec", help="only this spec name")
    show.add_argument("--path", help=f"DB file (default: ${ENV_VAR} or ~/.cache/opgen/tuning.json)")
    show.add_argument("--no-shipped", action="store_true", help="hide the shipped DB")
    show.set_defaults(func=_cli_show)

    prune = sub.add_parser(
        "prune", help="remove stale records (another opgen version, or a shipped spec "
                      "whose content changed)")
    prune.add_argument("--path")
    prune.add_argument("--spec", help="remove every record of this spec instead")
    prune.add_argument("--dry-run", action="store_true", help="only list what would go")
    prune.set_defaults(func=_cli_prune)

    export = sub.add_parser("export", help="write the records to another DB file")
    export.add_argument("out", help="output JSON file")
    export.add_argument("--path")
    export.add_argument("--with-shipped", action="store_true",
                        help="include the shipped records (user records win)")
    export.set_defaults(func=_cli_export)


def _cli_show(args) -> int:
    db = TuningDB(args.path, shipped=not args.no_shipped)
    rows = []
    for e in db.records("all"):
        try:
            k = DBKey.parse(e.key)
        except ValueError:
            continue
        if args.spec and k.spec != args.spec:
            continue
        r = e.record
        rows.append([e.source, k.spec, k.spec_hash[:8], k.device, k.arch, k.opgen_version,
                     k.nvrtc, k.N, k.K, e.bucket, r.get("M"), config_label(r),
                     float(r["median_us"]), r.get("heuristic_us"), speedup(r)])
    print(f"tuning DB: {db.path}" + ("" if db.path.exists() else " (no file yet)"))
    if not rows:
        print("no records" + (f" for spec {args.spec}" if args.spec else ""))
        return 0
    print(format_table(["source", "spec", "hash", "device", "arch", "opgen", "nvrtc", "N", "K",
                        "bucket", "M", "config", "us", "heur us", "speedup"], rows))
    return 0


def _cli_prune(args) -> int:
    db = TuningDB(args.path, shipped=False)
    if args.spec:
        def pred(key, bucket, rec):
            return key.split("|", 1)[0] == args.spec
    else:
        pred = stale()
    doomed = [e for e in db.records("user") if pred(e.key, e.bucket, e.record)]
    for e in doomed:
        print(f"{'would remove' if args.dry_run else 'remove'}  {e.key}  [{e.bucket}]")
    if not args.dry_run and doomed:
        n = db.prune(pred)
        print(f"removed {n} record(s) from {db.path}")
    elif not doomed:
        print(f"nothing to remove in {db.path}")
    return 0


def _cli_export(args) -> int:
    db = TuningDB(args.path)
    n = db.export(args.out, include_shipped=args.with_shipped)
    print(f"wrote {n} record(s) to {args.out}", file=sys.stderr)
    return 0

"""The tuning database: which tile config won for a (spec, device, N, K, M bucket).

One human-readable JSON file (db_file.py: its layout, and how several tuners
read and write it safely at once), its records keyed by

KEY = `str(DBKey)`, e.g.
"gptq_v1_w4a16_g128|3f2a9c...|sm_90|NVIDIA H200|0.1.0|nvrtc12.9|N8192|K8192":
everything that can change which config is fastest (or whether it still
compiles) is in the key, so a new opgen, NVRTC, spec revision or GPU simply
misses and falls back to the heuristic instead of using a stale winner.

RECORD = {"config": dict, "config_name": str, "M": int, "median_us": float,
          "runner_up_us": [float], "heuristic_us": float | None,
          "measured_at": ISO-8601 str, ...}  (extra fields are kept as is).

Where it lives: the `path` argument, else $OPGEN_TUNING_DB, else
$XDG_CACHE_HOME/opgen/tuning.json (~/.cache/opgen/tuning.json).  Read-only
DBs shipped in the package, one per device (opgen/data/tuning/<device>.json,
e.g. nvidia_h200.json for "NVIDIA H200"), are consulted after it: the
device in a key picks the file.  `opgen db` (opgen/cli/db.py) is the
command line.
"""
from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

from ..codegen.version import __version__
from ..codegen.buckets import LABELS, bucket_order
from ..codegen.resolve import load_spec, shipped_specs
from . import db_file
from .db_file import ENV_VAR, DBFile, Record, TuningDBError, record_ok  # noqa: F401 (the API)
from .device import current_arch, device_name, nvrtc_version

# The device the shipped kernels were tuned and measured on (docs/performance.md).
REFERENCE_DEVICE = "NVIDIA H200"

KeyLike = Union["DBKey", str]
# predicate(key string, bucket label, record) -> True to remove the record
Predicate = Callable[[str, str, Record], bool]


def default_path() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(cache).expanduser() / "opgen" / "tuning.json"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --- the shipped DBs ----------------------------------------------------------

def shipped_dir() -> Path:
    """Where the package keeps its tuning DBs, one file per device."""
    return Path(str(files("opgen") / "data" / "tuning"))


def device_file(device: str) -> str:
    """The shipped DB file of a device as the runtime names it:
    "NVIDIA H200" -> "nvidia_h200.json"."""
    return re.sub(r"[^a-z0-9]+", "_", device.lower()).strip("_") + ".json"


def shipped_path(device: str = REFERENCE_DEVICE) -> Optional[Path]:
    """The DB shipped for a device, or None when none is."""
    p = shipped_dir() / device_file(device)
    return p if p.is_file() else None


def shipped_paths() -> List[Path]:
    """Every shipped DB file, sorted."""
    d = shipped_dir()
    return sorted(d.glob("*.json")) if d.is_dir() else []


class _Shipped:
    """The read-only DBs a TuningDB falls back on: the shipped file of each
    key's device (opened the first time a key of that device is looked up),
    or one given file for every key."""

    def __init__(self, fixed: Optional[Path] = None):
        self.fixed = fixed
        self._files: Dict[Path, DBFile] = {}
        self._paths: Dict[str, Optional[Path]] = {}      # device -> its file

    def _file(self, path: Path) -> DBFile:
        if path not in self._files:
            self._files[path] = DBFile(path, shipped=True)
        return self._files[path]

    def for_key(self, key: str) -> Optional[DBFile]:
        if self.fixed is not None:
            return self._file(self.fixed)
        try:
            dev = DBKey.parse(key).device
        except ValueError:                      # not a DBKey: no device, no shipped file
            return None
        if dev not in self._paths:
            self._paths[dev] = shipped_path(dev)
        p = self._paths[dev]
        return None if p is None else self._file(p)

    def all(self) -> List[DBFile]:
        return [self._file(p) for p in ([self.fixed] if self.fixed is not None
                                        else shipped_paths())]

    def __repr__(self) -> str:
        return repr(str(self.fixed if self.fixed is not None else shipped_dir()))


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
    current GPU's (runtime.device: needs CUDA)."""
    arch = arch or current_arch()
    device = device or device_name()
    nvrtc = nvrtc or nvrtc_version()
    return DBKey(spec.name, spec.content_hash(), arch, str(device).replace("|", "/"),
                 version or __version__, str(nvrtc), int(N), int(K))


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


# --- the DB -------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    key: str
    bucket: str
    record: Record
    source: str                # "user" or "shipped"


class TuningDB:
    """The user's DB file, backed by read-only shipped DBs for lookups.

    shipped: True for the package's DB of each key's device (shipped_path),
    False/None for none, or a path to another read-only DB file (for every
    key).
    """

    def __init__(self, path: Union[str, os.PathLike, None] = None, shipped=True):
        self.path = Path(path).expanduser() if path else default_path()
        self._user = DBFile(self.path)
        if shipped is True:
            self._shipped: Optional[_Shipped] = _Shipped()
        elif shipped:
            self._shipped = _Shipped(Path(shipped))
        else:
            self._shipped = None

    def __repr__(self) -> str:
        return f"TuningDB({str(self.path)!r}, shipped={self._shipped!r})"

    def _shipped_for(self, key: str) -> Optional[DBFile]:
        return None if self._shipped is None else self._shipped.for_key(key)

    def _shipped_all(self) -> List[DBFile]:
        return [] if self._shipped is None else self._shipped.all()

    key = staticmethod(make_key)

    # reads
    def lookup(self, key: KeyLike, bucket: str) -> Optional[Record]:
        """The record for key and bucket: the user file's, else the shipped one's."""
        k = str(key)
        rec = self._user.read().records.get(k, {}).get(bucket)
        shipped = self._shipped_for(k)
        if rec is None and shipped is not None:
            rec = shipped.read().records.get(k, {}).get(bucket)
        return copy.deepcopy(rec)       # callers must not edit the cache

    def lookup_all(self, key: KeyLike) -> Dict[str, Record]:
        """{bucket: record} for key, user records overriding shipped ones."""
        k = str(key)
        out: Dict[str, Record] = {}
        shipped = self._shipped_for(k)
        if shipped is not None:
            out.update(shipped.read().records.get(k, {}))
        out.update(self._user.read().records.get(k, {}))
        return copy.deepcopy(out)

    def records(self, source: str = "user") -> List[Entry]:
        """Every record of the user file ('user'), the shipped DBs ('shipped')
        or both ('all'), sorted by key then bucket."""
        sources = {"user": [self._user], "shipped": self._shipped_all(),
                   "all": [self._user, *self._shipped_all()]}[source]
        out = []
        for f in sources:
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
            if not record_ok(rec):
                raise ValueError("a record needs a 'config' dict and a numeric 'median_us'")

        def merge(records):
            for key, bucket, rec in items:
                records.setdefault(key, {})[bucket] = copy.deepcopy(rec)
            return True
        db_file.update(self.path, merge)

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
        return db_file.update(self.path, drop, write_if=lambda n: n > 0)

    def export(self, path: Union[str, os.PathLike], include_shipped: bool = False) -> int:
        """Write the user records (and the shipped ones under them if asked) to
        a new DB file at `path`; returns the number of records written."""
        merged: Dict[str, Dict[str, Record]] = {}
        sources = (self._shipped_all() if include_shipped else []) + [self._user]
        for f in sources:
            for key, per in f.read().records.items():
                merged.setdefault(key, {}).update(per)
        db_file.atomic_write(Path(path).expanduser(), db_file.document(merged))
        return sum(len(per) for per in merged.values())


# --- stale records -------------------------------------------------------------

def shipped_spec_hashes() -> Dict[str, str]:
    """{spec name: content hash} of the specs shipped in opgen.specs."""
    out = {}
    for path in shipped_specs().values():
        try:
            spec = load_spec(path)
        except Exception:            # a broken shipped spec is not prune's business
            continue
        out[spec.name] = spec.content_hash()
    return out


def stale(version: Optional[str] = None,
          spec_hashes: Optional[Dict[str, str]] = None) -> Predicate:
    """Predicate: records of another opgen version, or of a shipped spec whose
    content changed since.  Keys that do not parse are kept (not ours to judge)."""
    version = version or __version__
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


def speedup(record: Record) -> Optional[float]:
    """How much faster the stored winner ran than the heuristic's pick."""
    h, t = record.get("heuristic_us"), record.get("median_us")
    return h / t if isinstance(h, (int, float)) and t else None

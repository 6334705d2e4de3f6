"""The tuning database: which tile config won for a (spec, device, N, K, M bucket).

One human-readable JSON file (db_file.py: its layout, how a damaged one is
read, and how several tuners read and write it safely at once), its records
keyed by

KEY = `str(DBKey)`, e.g. "gptq_v1_w4a16_g128|3f2a9c...|sm_90|NVIDIA H200|N8192|K8192":
the spec (name and content hash), the target, the GPU and the problem size.

RECORD = {"config": dict, "config_name": str, "M": int, "median_us": float,
          "runner_up_us": [float], "heuristic_us": float | None,
          "measured_at": ISO-8601 str, "source_hash": str, "nvrtc": str,
          "opgen": str, ...}  (extra fields are kept as is; the tuner adds
          "heuristic_config": the name of the pick heuristic_us timed).

A record is served only while its config renders to the code it was
measured on: the config's source hash today (codegen/source_hash.py: its
kernels' CUDA less comments and layout, and their launch constants) must
equal the record's "source_hash" (checked once per spec, config and arch in
a process).  So a change to a template or the planner that alters a kernel
retires its records, while one that does not, or another NVRTC or opgen
version, keeps them: those are in the record ("nvrtc", "opgen": what it was
measured with), not in the key.  Records without a source hash (the old key
form "...|<opgen>|nvrtc<X>|N..|K..") are never served; `opgen db prune`
removes them.

Where it lives: the `path` argument, else $OPGEN_TUNING_DB, else
$XDG_CACHE_HOME/opgen/tuning.json (~/.cache/opgen/tuning.json).  Read-only
DBs shipped in the package, one per device (opgen/data/tuning/<device>.json,
e.g. nvidia_h200.json for "NVIDIA H200"), are consulted after it: the
device in a key picks the file.  `opgen db` (opgen/cli/db.py) is the
command line.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple, Union

from ..codegen import planner
from ..codegen.version import __version__
from ..codegen.buckets import LABELS, bucket_order
from ..codegen.resolve import load_spec, shipped_specs
from ..codegen.source_hash import config_source_hash
from ..codegen.spec import Spec
from . import db_file
from .db_file import ENV_VAR, DBFile, Record, TuningDBError, record_problem  # noqa: F401 (the API)
from .device import current_arch, device_name

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

    def __init__(self, fixed: Optional[Path] = None, quiet: bool = False):
        self.fixed, self.quiet = fixed, quiet
        self._files: Dict[Path, DBFile] = {}
        self._paths: Dict[str, Optional[Path]] = {}      # device -> its file

    def _file(self, path: Path) -> DBFile:
        if path not in self._files:
            self._files[path] = DBFile(path, shipped=True, quiet=self.quiet)
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
    """What a tuning result is for.  str() gives the form stored in JSON."""
    spec: str
    spec_hash: str
    arch: str
    device: str
    N: int
    K: int
    # The Spec itself (make_key's): not part of the key; it lets a lookup
    # render the record's config.  A parsed key finds it among the shipped specs.
    definition: Optional[Spec] = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        for name in ("spec", "spec_hash", "arch", "device"):
            if "|" in str(getattr(self, name)):
                raise ValueError(f"DBKey.{name} must not contain '|': {getattr(self, name)!r}")

    def __str__(self) -> str:
        return "|".join((self.spec, self.spec_hash, self.arch, self.device,
                         f"N{self.N}", f"K{self.K}"))

    @classmethod
    def parse(cls, s: str) -> "DBKey":
        """A key string, of this form or the old one (which also named the
        opgen and NVRTC versions: its records have no source hash)."""
        return cls(*db_file.key_fields(s))


def make_key(spec: Spec, N: int, K: int, *, arch: Optional[str] = None,
             device: Optional[str] = None) -> DBKey:
    """The key for `spec` (a Spec) at N, K.  arch/device default to the
    current GPU's (runtime.device: needs CUDA)."""
    arch = arch or current_arch()
    device = device or device_name()
    return DBKey(spec.name, spec.content_hash(), arch, str(device).replace("|", "/"),
                 int(N), int(K), definition=spec)


def make_record(config: dict, median_us: float, *, M: int, runner_up_us=(),
                heuristic_us: Optional[float] = None, config_name: Optional[str] = None,
                **extra) -> Record:
    """A record measured now by this opgen; extra: e.g. source_hash (which
    put requires: rendered_hash), nvrtc."""
    rec: Record = {"config": dict(config), "M": int(M), "median_us": round(float(median_us), 4),
                   "runner_up_us": [round(float(t), 4) for t in runner_up_us],
                   # (informational: a time that is not one is left out, not the record)
                   "heuristic_us": (round(float(heuristic_us), 4)
                                    if db_file.positive_number(heuristic_us) else None),
                   "measured_at": now_iso(), "opgen": __version__}
    if config_name is not None:
        rec["config_name"] = config_name
    rec.update(extra)
    return rec


# --- is a record current ------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _shipped_definitions() -> Dict[str, Spec]:
    """{name: Spec} of the specs shipped in opgen.specs, and of the
    execution specs their kernels run (planner.execution_spec: what the
    tuner keys their records by)."""
    specs = []
    for path in shipped_specs().values():
        try:
            specs.append(load_spec(path))
        except Exception:            # a broken shipped spec is not the DB's business
            continue
    return planner.with_execution_specs(specs)


def definition_of(key: DBKey) -> Optional[Spec]:
    """The Spec a key is for: the one make_key was given, else the shipped
    spec of its name while its content is what the key says."""
    if key.definition is not None:
        return key.definition
    spec = _shipped_definitions().get(key.spec)
    return spec if spec is not None and spec.content_hash() == key.spec_hash else None


_RENDERED: Dict[tuple, Optional[str]] = {}


def rendered_hash(key: DBKey, config: dict) -> Optional[str]:
    """The source hash (codegen/source_hash.py) that `config`, a record's
    config dict, renders to today for the key's spec and arch; None when it
    does not render (a field missing or wrong, a config the planner refuses)
    or the spec is unknown.  Cached per (spec, config, arch) for the process:
    the first check of a config costs one render."""
    ck = (key.spec, key.spec_hash, key.arch, json.dumps(config, sort_keys=True, default=repr))
    if ck not in _RENDERED:
        spec = definition_of(key)
        if spec is None:             # not cached: a key that carries the spec may follow
            return None
        try:
            _RENDERED[ck] = config_source_hash(spec, planner.Config.from_dict(config), key.arch)
        except Exception:            # whatever a bad config makes rendering raise
            _RENDERED[ck] = None
    return _RENDERED[ck]


# record_status: the record can be served / cannot, and why (STALE: prune removes them).
CURRENT, NO_SOURCE_HASH, SPEC_CHANGED, SOURCE_CHANGED, BAD_CONFIG, UNKNOWN_SPEC, NOT_A_KEY = (
    "current", "no source hash", "spec changed", "source changed", "config does not render",
    "unknown spec", "not a key")
STALE = frozenset({NO_SOURCE_HASH, SPEC_CHANGED, SOURCE_CHANGED, BAD_CONFIG})


def shipped_spec_hashes() -> Dict[str, str]:
    """{spec name: content hash} of the specs shipped in opgen.specs and of
    their execution specs."""
    return {name: spec.content_hash() for name, spec in _shipped_definitions().items()}


def record_status(key: KeyLike, record: Record,
                  spec_hashes: Optional[Dict[str, str]] = None) -> str:
    """Whether a record is current (its config renders to the source it was
    measured on), or why not; spec_hashes: {name: content hash} of the specs
    whose other contents make a key stale (default: the shipped ones)."""
    try:
        k = key if isinstance(key, DBKey) else DBKey.parse(key)
    except ValueError:
        return NOT_A_KEY
    if not isinstance(record.get("source_hash"), str):
        return NO_SOURCE_HASH
    spec_hashes = shipped_spec_hashes() if spec_hashes is None else spec_hashes
    if k.spec in spec_hashes and spec_hashes[k.spec] != k.spec_hash:
        return SPEC_CHANGED
    if definition_of(k) is None:
        return UNKNOWN_SPEC
    now = rendered_hash(k, record["config"])
    if now is None:                   # (a field missing or wrong, a config the planner refuses)
        return BAD_CONFIG
    return CURRENT if now == record["source_hash"] else SOURCE_CHANGED


def stale(spec_hashes: Optional[Dict[str, str]] = None) -> Predicate:
    """Predicate: records that can never be served (record_status in STALE):
    no source hash, a shipped spec whose content changed since, or a config
    that no longer renders to the source it was measured on.  Records of
    specs that are not shipped (nothing to render them with) are kept: not
    ours to judge.  (A key that does not parse is a bad record: db_file.)"""
    hashes = shipped_spec_hashes() if spec_hashes is None else spec_hashes

    def pred(key: str, bucket: str, record: Record) -> bool:
        return record_status(key, record, hashes) in STALE
    return pred


def speedup(record: Record) -> Optional[float]:
    """How much faster the stored winner ran than the heuristic's pick."""
    h, t = record.get("heuristic_us"), record.get("median_us")
    return h / t if db_file.positive_number(h) and db_file.positive_number(t) else None


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
    key).  quiet: report problems only through problems(), not as warnings
    (the command line prints them itself).
    """

    def __init__(self, path: Union[str, os.PathLike, None] = None, shipped=True,
                 quiet: bool = False):
        self.path = Path(path).expanduser() if path else default_path()
        self.quiet = quiet
        self._user = DBFile(self.path, quiet=quiet)
        if shipped is True:
            self._shipped: Optional[_Shipped] = _Shipped(quiet=quiet)
        elif shipped:
            self._shipped = _Shipped(Path(shipped), quiet=quiet)
        else:
            self._shipped = None
        self._skipped: Set[Tuple[str, str, str]] = set()     # (file, key, bucket) warned of

    def __repr__(self) -> str:
        return f"TuningDB({str(self.path)!r}, shipped={self._shipped!r})"

    def _shipped_for(self, key: str) -> Optional[DBFile]:
        return None if self._shipped is None else self._shipped.for_key(key)

    def _shipped_all(self) -> List[DBFile]:
        return [] if self._shipped is None else self._shipped.all()

    key = staticmethod(make_key)

    # reads
    def _served(self, f: DBFile, key: Optional[DBKey], k: str, bucket: str,
                rec: Record) -> bool:
        """Whether a stored record may be served: its config renders today to
        the source hash it was measured with (warned once when not)."""
        h = rec.get("source_hash")
        if key is not None and isinstance(h, str) and rendered_hash(key, rec["config"]) == h:
            return True
        if not self.quiet and (str(f.path), k, bucket) not in self._skipped:
            self._skipped.add((str(f.path), k, bucket))
            what = "shipped tuning DB" if f.shipped else "tuning DB"
            why = ("it has no source hash" if not isinstance(h, str) else
                   "its config no longer renders to the kernel it was measured on")
            warnings.warn(f"{what} {f.path}: skipping the record of {k} [{bucket}]: {why} "
                          "(the heuristic's config is used; `opgen db prune` removes such "
                          "records, `opgen tune` measures afresh)", RuntimeWarning, stacklevel=3)
        return False

    def _current(self, key: KeyLike) -> Tuple[str, Optional[DBKey], List[DBFile]]:
        """(key string, DBKey or None, the files to read: shipped first)."""
        k = str(key)
        try:
            dbkey = key if isinstance(key, DBKey) else DBKey.parse(k)
        except ValueError:                   # not a key: nothing can be checked, none served
            dbkey = None
        shipped = self._shipped_for(k)
        return k, dbkey, ([shipped] if shipped is not None else []) + [self._user]

    def lookup(self, key: KeyLike, bucket: str) -> Optional[Record]:
        """The record for key and bucket that may be served: the user file's,
        else the shipped one's; None when neither has a current one.  key: a
        DBKey from make_key, or a key string of a shipped spec."""
        k, dbkey, sources = self._current(key)
        for f in reversed(sources):                  # the user file first
            rec = f.read().records.get(k, {}).get(bucket)
            if rec is not None and self._served(f, dbkey, k, bucket, rec):
                return copy.deepcopy(rec)       # callers must not edit the cache
        return None

    def lookup_all(self, key: KeyLike) -> Dict[str, Record]:
        """{bucket: record} for key, the records that may be served, user
        records overriding shipped ones."""
        k, dbkey, sources = self._current(key)
        out: Dict[str, Record] = {}
        for f in sources:
            for bucket, rec in f.read().records.get(k, {}).items():
                if self._served(f, dbkey, k, bucket, rec):
                    out[bucket] = rec
        return copy.deepcopy(out)

    def records(self, source: str = "user") -> List[Entry]:
        """Every well-formed record of the user file ('user'), the shipped DBs
        ('shipped') or both ('all'), sorted by key then bucket, served or not
        (record_status says)."""
        out = []
        for f in self._files(source):
            src = "shipped" if f.shipped else "user"
            for key, per in f.read().records.items():
                for bucket, rec in per.items():
                    out.append(Entry(key, bucket, copy.deepcopy(rec), src))
        out.sort(key=lambda e: (e.source != "user", e.key, bucket_order(e.bucket), e.bucket))
        return out

    def problems(self, source: str = "all") -> List[str]:
        """One line per thing wrong with the files of `source` (db_file.problems):
        a file that cannot be read or used, each bad record skipped."""
        return [line for f in self._files(source) for line in f.problems()]

    def usable(self) -> bool:
        """Whether the user file can be read (missing is fine: it is made on
        the first write)."""
        return self._user.read().kind in ("ok", "missing")

    def _files(self, source: str) -> List[DBFile]:
        return {"user": [self._user], "shipped": self._shipped_all(),
                "all": [self._user, *self._shipped_all()]}[source]

    # writes
    def check_writable(self) -> None:
        """TuningDBError now for a user file that a write would refuse (not
        ours, unreadable, read-only, no folder for it): before hours of
        tuning, not after its first pair. Writes nothing, and makes no folder
        (db_file.check_writable)."""
        db_file.check_writable(self.path)

    def put(self, key: KeyLike, bucket: str, record: Record) -> None:
        self.put_many([(key, bucket, record)])

    def put_many(self, items: Iterable[Tuple[KeyLike, str, Record]]) -> None:
        """Store several records under one lock (one read-merge-replace)."""
        items = [(str(k), b, r) for k, b, r in items]
        for key, bucket, rec in items:
            db_file.key_fields(key)            # ValueError: a key no lookup could name
            if bucket not in LABELS:
                raise ValueError(f"unknown M bucket {bucket!r}; known: {', '.join(LABELS)}")
            why = record_problem(bucket, rec)
            if why is not None:
                raise ValueError(f"not a record the DB can keep: {why}")
            if not isinstance(rec.get("source_hash"), str):
                raise ValueError("a record needs its config's 'source_hash' (rendered_hash): "
                                 "without one it is never served")

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
        the DB file at `path`, replacing its records (a file that is not a DB
        is never overwritten: TuningDBError); returns how many were written."""
        merged: Dict[str, Dict[str, Record]] = {}
        sources = (self._shipped_all() if include_shipped else []) + [self._user]
        for f in sources:
            for key, per in f.read().records.items():
                merged.setdefault(key, {}).update(per)

        def replace(records):
            records.clear()
            records.update(copy.deepcopy(merged))
        db_file.update(Path(path).expanduser(), replace)
        return sum(len(per) for per in merged.values())

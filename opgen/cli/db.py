"""`opgen db show|prune|export`: inspect and maintain the tuning DB.

Every problem with a DB file (unreadable, not a DB, a bad record, a path the
filesystem refuses) is one line on stderr naming the file, and exit status 2;
nothing of it is a Python warning or traceback.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from typing import List

from ..codegen.errors import UserError, shorten
from ..runtime.tuner import heuristic_unchanged, tuned_among_current
from ..runtime.tuning_db import (CURRENT, ENV_VAR, DBKey, Record, TuningDB, TuningDBError,
                                 definition_of, record_status, speedup, stale)
from .command import Command
from .table import format_table

EXIT_PROBLEM = 2


def _db_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="db_command", metavar="{show,prune,export}")
    sub.required = True

    show = sub.add_parser("show", help="list tuned records")
    show.add_argument("--spec", help="only this spec name")
    show.add_argument("--path", help=f"DB file (default: ${ENV_VAR} or ~/.cache/opgen/tuning.json)")
    show.add_argument("--no-shipped", action="store_true", help="hide the shipped DBs")
    show.add_argument("--check", action="store_true",
                      help="render each record's config and say whether it is served (its "
                           "source is what it was measured on) or why not, whether it was "
                           "tuned among the candidates the planner offers today (`opgen tune` "
                           "redoes those that were not), and whether its heuristic figure "
                           "timed today's heuristic pick")
    show.set_defaults(db_run=cmd_show)

    prune = sub.add_parser(
        "prune", help="remove the records that can never be served (no source hash, a shipped "
                      "spec whose content changed, a config that no longer renders to the "
                      "kernel it was measured on)")
    prune.add_argument("--path")
    prune.add_argument("--spec", help="remove every record of this spec instead")
    prune.add_argument("--dry-run", action="store_true", help="only list what would go")
    prune.set_defaults(db_run=cmd_prune)

    export = sub.add_parser("export", help="write the records to another DB file")
    export.add_argument("out", help="output JSON file")
    export.add_argument("--path")
    export.add_argument("--with-shipped", action="store_true",
                        help="include the shipped records (user records win)")
    export.set_defaults(db_run=cmd_export)


def cmd_db(args: argparse.Namespace) -> int:
    # What a write says on the way (a damaged file copied aside) is a line
    # too, not a Python warning.
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            rc = args.db_run(args)
        except TuningDBError as e:
            rc = _report([str(e)])
    for w in said:
        print(f"opgen: warning: {w.message}", file=sys.stderr)
    return rc


def _report(problems: List[str]) -> int:
    """Print each problem on stderr; the exit status."""
    sys.stdout.flush()
    for line in problems:
        print(f"opgen: error: {line}", file=sys.stderr)
    return EXIT_PROBLEM if problems else 0


def config_label(record: Record) -> str:
    name = record.get("config_name")
    if name:
        return str(name)
    return ",".join(f"{k}={v}" for k, v in sorted(record.get("config", {}).items()))


def cmd_show(args: argparse.Namespace) -> int:
    db = TuningDB(args.path, shipped=not args.no_shipped, quiet=True)
    rows = []
    for e in db.records("all"):
        try:
            k = DBKey.parse(e.key)
        except ValueError:
            continue
        if args.spec and k.spec != args.spec:
            continue
        r = e.record
        row = [e.source, k.spec, k.spec_hash[:8], k.device, k.arch, k.N, k.K, e.bucket,
               r.get("M"), config_label(r), float(r["median_us"]), r.get("heuristic_us"),
               speedup(r), r.get("nvrtc")]
        rows.append(row + (_check(k, e.key, r) if args.check else []))
    try:
        there = db.path.exists()
    except OSError as e:                 # e.g. a name longer than the filesystem allows
        raise UserError(f"--path: cannot use {shorten(str(db.path))} ({e.strerror or e})") from None
    print(f"tuning DB: {db.path}" + ("" if there else " (no file yet)"))
    if not rows:
        print("no records" + (f" for spec {args.spec}" if args.spec else ""))
    else:
        print(format_table(["source", "spec", "hash", "device", "arch", "N", "K", "bucket", "M",
                            "config", "us", "heur us", "speedup", "nvrtc"]
                           + (["status", "candidates", "heuristic"] if args.check else []), rows))
    return _report(db.problems())


def _check(k: DBKey, key: str, r: Record) -> List[str]:
    """[whether the record is served, whether it was tuned among today's
    candidates, whether its heuristic_us timed today's heuristic pick (so
    that its speedup is still the heuristic's): each "same", "changed" (or
    "unknown": tuned before records kept that), "-" where it is not served]."""
    status = record_status(key, r)
    spec = definition_of(k)
    if status != CURRENT or spec is None:
        return [status, "-", "-"]
    same = tuned_among_current(spec, k.arch, k.N, k.K, r)
    heur = heuristic_unchanged(spec, k.arch, k.N, k.K, r)
    return [status, "same" if same else "changed" if "candidates" in r else "unknown",
            "unknown" if heur is None else "same" if heur else "changed"]


def cmd_prune(args: argparse.Namespace) -> int:
    db = TuningDB(args.path, shipped=False, quiet=True)
    if not db.usable():                 # nothing to judge: say why instead of "nothing to remove"
        return _report(db.problems())
    if args.spec:
        def pred(key, bucket, rec):
            return key.split("|", 1)[0] == args.spec
    else:
        pred = stale()
    doomed = [e for e in db.records("user") if pred(e.key, e.bucket, e.record)]
    if not args.dry_run and doomed:
        db.check_writable()             # (before any line says "remove")
    for e in doomed:
        why = "" if args.spec else f"  ({record_status(e.key, e.record)})"
        print(f"{'would remove' if args.dry_run else 'remove'}  {e.key}  [{e.bucket}]{why}")
    if not args.dry_run and doomed:
        n = db.prune(pred)
        print(f"removed {n} record(s) from {db.path}")
    elif not doomed:
        print(f"nothing to remove in {db.path}")
    return _report(db.problems())


def cmd_export(args: argparse.Namespace) -> int:
    db = TuningDB(args.path, quiet=True)
    if not db.usable():                 # never write an empty export of an unreadable DB
        return _report(db.problems())
    n = db.export(args.out, include_shipped=args.with_shipped)
    print(f"wrote {n} record(s) to {args.out}", file=sys.stderr)
    return _report(db.problems("user" if not args.with_shipped else "all"))


COMMANDS = (Command("db", "inspect and maintain the tuning database", _db_args, cmd_db),)

"""`opgen db show|prune|export`: inspect and maintain the tuning DB."""
from __future__ import annotations

import argparse
import sys

from ..runtime.tuning_db import ENV_VAR, DBKey, Record, TuningDB, speedup, stale
from .command import Command
from .table import format_table


def _db_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="db_command", metavar="{show,prune,export}")
    sub.required = True

    show = sub.add_parser("show", help="list tuned records")
    show.add_argument("--spec", help="only this spec name")
    show.add_argument("--path", help=f"DB file (default: ${ENV_VAR} or ~/.cache/opgen/tuning.json)")
    show.add_argument("--no-shipped", action="store_true", help="hide the shipped DBs")
    show.set_defaults(db_run=cmd_show)

    prune = sub.add_parser(
        "prune", help="remove stale records (another opgen version, or a shipped spec "
                      "whose content changed)")
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
    return args.db_run(args)


def config_label(record: Record) -> str:
    name = record.get("config_name")
    if name:
        return str(name)
    return ",".join(f"{k}={v}" for k, v in sorted(record.get("config", {}).items()))


def cmd_show(args: argparse.Namespace) -> int:
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


def cmd_prune(args: argparse.Namespace) -> int:
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


def cmd_export(args: argparse.Namespace) -> int:
    db = TuningDB(args.path)
    n = db.export(args.out, include_shipped=args.with_shipped)
    print(f"wrote {n} record(s) to {args.out}", file=sys.stderr)
    return 0


COMMANDS = (Command("db", "inspect and maintain the tuning database", _db_args, cmd_db),)

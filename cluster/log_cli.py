"""`brokerd log tail|check`: a console consumer and a verifier for the commit log.

``tail`` reads every router log under ``--data-dir`` (``<data>/<node>/<router>/``) from the disk,
read-only, while the broker may be running: it never forces the broker to flush and sees what has
been written. ``--follow`` keeps polling for new records like ``tail -f``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time

from brokerd.router.log import LogReader, check
from brokerd.router.topics import filter_matches, valid_topic_filter


def _router_dirs(data_dir: str, routers: list[str] | None) -> list[tuple[str, str]]:
    """(router id 'node/wN', directory) of every log under ``data_dir``."""
    out: list[tuple[str, str]] = []
    if not os.path.isdir(data_dir):
        return out
    for node in sorted(os.listdir(data_dir)):
        node_dir = os.path.join(data_dir, node)
        if not os.path.isdir(node_dir):
            continue
        for name in sorted(os.listdir(node_dir)):
            path = os.path.join(node_dir, name)
            rid = f"{node}/{name}"
            if name.startswith(("_", ".")):
                continue  # ``_replicas``: copies of other nodes' logs
            if os.path.isdir(path) and (not routers or rid in routers or name in routers):
                out.append((rid, path))
    return out


def _parse_time(text: str) -> int:
    """ISO 8601 (``2026-11-21T10:00:00``, UTC unless it says otherwise) or epoch seconds → ms."""
    try:
        return int(float(text) * 1000)
    except ValueError:
        pass
    t = dt.datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


def _fmt_payload(payload: bytes, limit: int = 200) -> str:
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        text = payload.hex()
    return text if len(text) <= limit else text[:limit] + "…"


def _add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="the broker's --data-dir (default: the --config file's, else ./data)")
    p.add_argument("--config", metavar="FILE", help="the broker's TOML config file: its data_dir is the default "
                   "(BROKERD_DATA_DIR and BROKERD_CONFIG count too, as for the broker)")


def _data_dir(args: argparse.Namespace, prog: str) -> str | None:
    """--data-dir, else the broker's own (--config FILE, BROKERD_* variables, its default); None after
    printing the error."""
    if args.data_dir:
        given: str = args.data_dir
        return given
    from .config import ConfigError, load

    try:
        return load(["--config", args.config] if args.config else []).data_dir
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return None


def tail(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="brokerd log tail", description="Print commit log records.")
    _add_data_dir(p)
    p.add_argument("--topic", default="#", help="MQTT filter (+ and #); default all")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="from the oldest record kept")
    start.add_argument("--from-time", metavar="T", help="from this time (ISO 8601 or epoch seconds)")
    p.add_argument("--router", action="append", help="only this router (node/wN or wN; repeatable)")
    p.add_argument("--origin-only", action="store_true", help="skip copies forwarded from other routers")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    p.add_argument("--max", type=int, default=0, help="stop after this many records (0: no limit)")
    p.add_argument("--json", action="store_true", help="one JSON object per record")
    args = p.parse_args(argv)
    args.data_dir = _data_dir(args, p.prog)
    if args.data_dir is None:
        return 2
    if not valid_topic_filter(args.topic):
        print(f"brokerd log tail: error: --topic: invalid MQTT filter {args.topic!r}", file=sys.stderr)
        return 2
    dirs = _router_dirs(args.data_dir, args.router)
    if not dirs:
        print(f"brokerd log tail: error: --data-dir: no commit log under {args.data_dir}", file=sys.stderr)
        return 2
    readers = {rid: LogReader(path) for rid, path in dirs}
    positions: dict[str, int] = {}
    since = _parse_time(args.from_time) if args.from_time else None
    for rid, reader in readers.items():
        if args.from_beginning:
            positions[rid] = reader.start_offset or 0
        elif since is not None:
            off = reader.offset_for_time(since)
            positions[rid] = reader.end_offset if off is None else off
        else:  # like `tail -f`: only what comes from now on; without --follow, the last 10 per router
            end = reader.end_offset
            positions[rid] = end if args.follow else max(end - 10, reader.start_offset or 0)
    printed = 0
    try:
        while True:
            batch = []
            read_any = False
            for rid, reader in readers.items():
                reader.refresh()
                records = reader.read(positions[rid], max_records=1000)
                if records:
                    positions[rid] = records[-1].offset + 1
                    read_any = True
                for r in records:
                    if since is not None and r.timestamp_ms < since:
                        continue
                    if args.origin_only and r.origin_router != rid:
                        continue
                    if filter_matches(args.topic, r.topic):
                        batch.append((r.timestamp_ms, rid, r))
            batch.sort(key=lambda x: x[0])
            for ts, rid, r in batch:
                if args.json:
                    print(json.dumps({"router": rid, "offset": r.offset, "timestamp_ms": ts,
                                      "origin_router": r.origin_router, "origin_offset": r.origin_offset,
                                      "client_id": r.client_id, "topic": r.topic, "qos": r.qos,
                                      "retain": r.retain, "payload": _fmt_payload(r.payload, 1 << 20)}))
                else:
                    when = dt.datetime.fromtimestamp(ts / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    print(f"{when} {rid}@{r.offset} q{r.qos}{' R' if r.retain else ''} {r.client_id or '-'} "
                          f"{r.topic} {_fmt_payload(r.payload)}")
                printed += 1
                if args.max and printed >= args.max:
                    return 0
            sys.stdout.flush()
            if not args.follow and not read_any:
                return 0  # (read in steps of 1,000: before, only the first step was printed)
            if not batch:
                time.sleep(0.2)  # polling the files: the broker is never asked to flush
    except KeyboardInterrupt:
        return 0
    finally:
        for reader in readers.values():
            reader.close()


def check_cmd(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="brokerd log check", description="Verify every segment of every log.")
    _add_data_dir(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    args.data_dir = _data_dir(args, p.prog)
    if args.data_dir is None:
        return 2
    dirs = _router_dirs(args.data_dir, None)
    if not dirs:
        print(f"brokerd log check: error: --data-dir: no commit log under {args.data_dir}", file=sys.stderr)
        return 2
    ok = True
    reports = {}
    for rid, path in dirs:
        report = check(path)
        ok = ok and report.ok
        reports[rid] = report
    if args.json:
        print(json.dumps({rid: r.to_dict() for rid, r in reports.items()}, indent=2))
    else:
        for rid, r in reports.items():
            print(f"== {rid}\n{r.format_text()}")
        print("all segments OK" if ok else "PROBLEMS FOUND (see above)")
    return 0 if ok else 1


USAGE = """usage: brokerd log {tail,check} [options]

Read the commit log of a broker from its data directory (read-only; the broker may be running).

  tail    print records: the last 10 per router, --follow, --from-beginning, --topic FILTER, --json
  check   verify every segment of every router's log (exit 1 when something is wrong)

Each takes --data-dir DIR or --config FILE (the broker's TOML file) and has --help."""


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if not argv or argv[0] not in ("tail", "check"):
        what = f"unknown command {argv[0]!r}" if argv else "a command is needed"
        print(f"{USAGE.splitlines()[0]}\nbrokerd log: error: {what} (tail or check)", file=sys.stderr)
        return 2
    return tail(argv[1:]) if argv[0] == "tail" else check_cmd(argv[1:])

"""``brokerd-pipeline``: the Spark jobs over the broker's commit log.

    brokerd-pipeline traffic   --data-dir ./data --out ./reports --window 1m [--follow]
    brokerd-pipeline telemetry --topic 'devices/+/telemetry' --data-dir ./data --out ./reports
    brokerd-pipeline package   --out dist     # what spark-submit needs to run the jobs on a cluster

The same entry point runs locally (``--master local[*]``, the default) and under ``spark-submit``
(which picks the master; see ``docs/pipeline.md``). Options are checked before Spark starts, so a
typo costs a second, not a JVM start-up.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import zipfile
from collections.abc import Sequence

PROG = "brokerd-pipeline"
EXTRA_MODULES = ("pyspark", "pyarrow", "paho")  # what the `pipeline` extra installs

try:
    from brokerd.pipeline.publish import PublishError
    from brokerd.pipeline.source import OptionError, ReadOptions
    from brokerd.pipeline.topics import TopicFilterError
except ModuleNotFoundError as exc:  # installed without the extra: say which one, not a traceback
    if (exc.name or "").split(".")[0] not in EXTRA_MODULES:
        raise
    _MISSING: str | None = exc.name
else:
    _MISSING = None
LAUNCHER = "brokerd_pipeline_main.py"


def _parser() -> argparse.ArgumentParser:
    from brokerd.pipeline.jobs import telemetry, traffic

    p = argparse.ArgumentParser(prog=PROG, description="Spark jobs over the brokerd commit log.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{traffic,telemetry,package}")
    t = sub.add_parser("traffic", help="messages and bytes per topic, topic prefix, client id and router, "
                                       "per window", description=traffic.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    traffic.add_args(t)
    m = sub.add_parser("telemetry", help="per device and window: count/min/max/avg of every numeric JSON "
                                         "field", description=telemetry.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    telemetry.add_args(m)
    k = sub.add_parser("package", help="write the zip (--py-files) and launcher spark-submit needs")
    k.add_argument("--out", default="dist", help="directory to write them to (default dist)")
    return p


def _check(args: argparse.Namespace) -> None:
    """Fail on bad options before Spark starts (the same checks the data source makes)."""
    from brokerd.pipeline.jobs import common

    if args.follow is False and (args.available_now or args.max_records_per_trigger):
        raise OptionError("--available-now and --max-records-per-trigger only apply with --follow")
    if args.max_records_per_trigger is not None and args.max_records_per_trigger < 1:
        raise OptionError("--max-records-per-trigger must be at least 1")
    if not os.path.isdir(args.data_dir):
        raise OptionError(f"--data-dir: {args.data_dir} is not a directory (the broker's --data-dir)")
    ReadOptions.parse({"path": args.data_dir, **common.source_options(args)})
    if args.publish_to:
        from brokerd.pipeline.publish import parse_host_port

        parse_host_port(args.publish_to)


def package(out: str) -> list[str]:
    """``brokerd_pipeline.zip`` (the ``pipeline`` and ``router`` packages, for ``--py-files``) and a
    launcher script for spark-submit's primary resource. Returns the paths written."""
    os.makedirs(out, exist_ok=True)
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    archive = os.path.join(out, "brokerd_pipeline.zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        # The packages as installed, under brokerd/ (an explicit package here: zipimport and the
        # executors' path then need no namespace-package support).
        z.writestr("brokerd/__init__.py", '"""brokerd, as packaged for spark-submit --py-files."""\n')
        for package_name in ("pipeline", "router", "connection"):
            for dirpath, dirnames, filenames in os.walk(os.path.join(root, package_name)):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(filenames):
                    if name.endswith((".py", ".md")):
                        full = os.path.join(dirpath, name)
                        z.write(full, os.path.join("brokerd", os.path.relpath(full, root)))
    launcher = os.path.join(out, LAUNCHER)
    with open(launcher, "w") as f:
        f.write('"""spark-submit entry point: the brokerd-pipeline CLI from the --py-files zip."""\n'
                "import sys\n\nfrom brokerd.pipeline.cli import main\n\nsys.exit(main())\n")
    return [archive, launcher]


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``brokerd-pipeline``: parse, check, run the job; exit status 0 on success."""
    if _MISSING is not None:
        print(f"{PROG}: error: {_MISSING} is not installed; the pipeline needs brokerd's `pipeline` "
              "extra: pip install 'brokerd[pipeline]' (or pipx install 'brokerd[pipeline]')", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    if args.command == "package":
        for path in package(args.out):
            print(path)
        return 0
    try:
        _check(args)
    except (OptionError, TopicFilterError, PublishError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    from brokerd.pipeline.jobs import common, telemetry, traffic
    from brokerd.pipeline.session import get_session

    job = {"traffic": traffic, "telemetry": telemetry}[args.command]
    spark, created = get_session(f"{PROG} {args.command}", args.master, common.spark_conf(args))
    try:
        return job.run(spark, args)
    except PublishError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if created:
            try:
                spark.stop()
            except Exception as exc:  # the JVM may already be gone after SIGTERM to the process group
                logging.getLogger(__name__).debug("spark.stop: %s", exc)


if __name__ == "__main__":
    sys.exit(main())

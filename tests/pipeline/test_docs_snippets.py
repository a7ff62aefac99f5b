"""Every Python snippet of README and docs/pipeline.md runs as typed, as a reader outside the checkout
runs it: in a process of its own, with brokerd importable only as ``brokerd.*`` (as installed) and no
``PYSPARK_PYTHON`` set, so Spark's workers get the ``python3`` on ``PATH`` unless the snippet says
otherwise. Both went wrong once: ``import pipeline`` works only inside the checkout, and a worker
without msgpack fails the first read.

The snippets of one page run in order in one namespace (a later one uses an earlier one's ``df``),
against a log of known records in the process's working directory (``./data``, as the snippets
say). What a snippet leaves to do is done for it: its DataFrames are counted (that is when Spark's
workers read), a streaming query is run to its end, and the traffic report a snippet reads is made
first by the page's own ``brokerd-pipeline traffic`` line. One JVM serves both pages; each page gets
a fresh SparkSession, started with the environment as it was before the page ran.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.pipeline.conftest import java_available
from tests.pipeline.logsim import LogSim

PAGES = ("README.md", "docs/pipeline.md")
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: inside the snippets' startTime/endTime
RUN_S = 300  # one JVM start (10-20 s on a small machine) and a few small reads

# Runs in the child, cwd = the test's directory, argv[1] = the checkout's root.
RUNNER = r'''
import json, os, re, sys

from pyspark.sql import SparkSession

root = sys.argv[1]
fence = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
clean_env = dict(os.environ)
results = {}
for page in ("README.md", "docs/pipeline.md"):
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    os.environ.clear()
    os.environ.update(clean_env)
    text = open(os.path.join(root, page), encoding="utf-8").read()
    ns = {"__name__": "__snippet__"}
    counts = {}
    for i, code in enumerate(fence.findall(text), 1):
        if "reports/traffic" in code:
            line = re.search(r"^brokerd-pipeline traffic --data-dir \./data --out \./reports --window 1m", text, re.M)
            assert line, page + ": the traffic report a snippet reads is made by no brokerd-pipeline line"
            from brokerd.pipeline.cli import main
            assert main(line.group(0).split()[1:]) == 0, "brokerd-pipeline traffic failed"
        exec(compile(code, f"{page}, python snippet {i}", "exec"), ns)
        q = ns.get("q")
        if q is not None and "out" not in counts:
            q.processAllAvailable()
            q.stop()
            counts["out"] = ns["spark"].read.parquet("./out").count()
        for name in ("df", "once"):
            if name in ns and name not in counts:
                counts[name] = ns[name].count()
        counts["snippets"] = i
    results[page] = counts
print("RESULT " + json.dumps(results))
'''


def python_snippets(page: str) -> list[str]:
    return FENCE.findall((ROOT / page).read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", PAGES)
def test_snippets_import_what_an_installed_brokerd_has(page):
    """Without Spark: each snippet is Python, imports the pipeline as installed, and a snippet that
    starts a SparkSession names the workers' Python before it does."""
    snippets = python_snippets(page)
    assert snippets, f"{page} has no python snippet"
    for i, code in enumerate(snippets, 1):
        compile(code, f"{page}, python snippet {i}", "exec")
        assert not re.search(r"^\s*import pipeline\b", code, re.M), (
            f"{page}, snippet {i}: `import pipeline` works only inside the checkout; "
            "write `from brokerd import pipeline`")
        if "SparkSession.builder" in code:
            before = code.split("SparkSession.builder", 1)[0]
            assert "PYSPARK_PYTHON" in before, (
                f"{page}, snippet {i}: Spark's workers run the python3 on PATH unless PYSPARK_PYTHON names one")


def _write_log(data_dir) -> LogSim:
    """Two routers; sensors/+/temp on 2026-01-01 (what ``once`` selects), other topics besides, some
    forwarded to the other router (copies that ``originOnly`` leaves out)."""
    sim = LogSim(data_dir)
    topics = ("sensors/kitchen/temp", "sensors/hall/temp", "sensors/t1", "devices/7/telemetry")
    for i in range(40):
        router = ("w0", "w1")[i % 2]
        other = ("w1", "w0")[i % 2]
        sim.publish(router, topics[i % len(topics)], b'{"temp": %d}' % i, client_id=f"c{i % 3}",
                    timestamp_ms=BASE_MS + i * 1000, forward_to=(other,) if i % 5 == 0 else ())
    sim.close()
    return sim


def test_the_snippets_run_as_typed_outside_the_checkout(tmp_path):
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[pipeline]')")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[pipeline]')")
    if not java_available():
        pytest.skip("no Java runtime: Spark cannot start; scripts/test installs one")
    sim = _write_log(tmp_path / "data")
    runner = tmp_path / "run_snippets.py"
    runner.write_text(RUNNER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    # brokerd as installed: the brokerd.* namespace of this checkout, not its top-level packages.
    env["PYTHONPATH"] = str(ROOT / "scripts" / "lib" / "pythonpath")
    venv_bin = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.pop("VIRTUAL_ENV", None)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # this host's name may not resolve; nothing in the snippets
    done = subprocess.run([sys.executable, str(runner), str(ROOT)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=RUN_S)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    results = json.loads(line.removeprefix("RESULT "))
    every_record = len(sim.logged)
    once = sum(1 for s in sim.sent if re.fullmatch(r"sensors/[^/]+/temp", s.topic))
    sensors = sum(1 for _, _, s in sim.logged if s.topic.startswith("sensors/"))
    readme, page = results["README.md"], results["docs/pipeline.md"]
    assert readme == {"df": every_record, "once": once, "snippets": len(python_snippets("README.md"))}, tail
    assert page["df"] == every_record and page["once"] == once and page["out"] == sensors, tail
    assert page["snippets"] == len(python_snippets("docs/pipeline.md")), tail
    assert (tmp_path / "reports" / "traffic").is_dir()

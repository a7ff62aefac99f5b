"""Fixtures for the Spark pipeline tests: one local SparkSession for the whole run.

Starting a JVM costs 10-20 s on a small machine, so the session is shared (session scope) and kept
small: ``local[2]``, no UI, two shuffle partitions, 1 GiB of driver memory. Workers and driver run
this interpreter (``PYSPARK_PYTHON``), the one that has the project installed. Without pyspark or
without a Java runtime the Spark tests are skipped with the reason; pure-Python tests still run.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest


def java_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return True
    return shutil.which("java") is not None


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[pipeline]')")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[pipeline]')")
    if not java_available():
        pytest.skip("no Java runtime (java not on PATH, JAVA_HOME unset): Spark cannot start; "
                    "scripts/test installs one")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from brokerd import pipeline

    session = (
        SparkSession.builder.master("local[2]")
        .appName("brokerd-pipeline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    pipeline.register(session)
    yield session
    session.stop()

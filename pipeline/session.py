"""The SparkSession the pipeline's jobs run in: local by default, the cluster's under spark-submit.

Why a helper: the same job code must run unchanged as ``brokerd-pipeline traffic`` (which starts a
local Spark, ``local[*]`` unless ``--master`` says otherwise), under ``spark-submit`` (which has
already chosen the master: the job must not override it), and inside a process that already has a
session (tests, a notebook: reuse it, and do not stop it afterwards).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

from pyspark.sql import SparkSession

from brokerd import pipeline

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands the Python driver its gateway."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_session(app_name: str, master: str | None = None, conf: Iterable[tuple[str, str]] = ()) -> tuple[
        SparkSession, bool]:
    """(session, created): the active session if there is one, else a new one.

    A new local session runs its Python workers with this interpreter (``PYSPARK_PYTHON``), the
    one with brokerd and pyarrow installed, unless the environment already names one. Session time
    is UTC so windows and timestamps in reports do not depend on the host's zone.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        pipeline.register(active)
        return active, False
    if master is None and not under_spark_submit():
        master = DEFAULT_MASTER
    if master is not None and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
    for key, value in conf:
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    pipeline.register(spark)
    return spark, True

"""The data pipeline on Spark: the ``brokerlog`` data source and the jobs built on it.

    import pipeline
    pipeline.register(spark)
    spark.read.format("brokerlog").load("./data")

Importing this package does not import pyspark (the broker imports nothing from here); the data
source lives in ``pipeline.source``, the jobs in ``pipeline.jobs``, the CLI in ``pipeline.cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Make ``format("brokerlog")`` available in this session.

    Also turns on ``spark.sql.python.filterPushdown.enabled``: the reader uses pushed-down filters on
    offset, timestamp, node and router to skip whole segments, and Spark refuses to plan a Python
    source that implements ``pushFilters`` while that setting is off.
    """
    from pipeline.source import BrokerLogDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(BrokerLogDataSource)

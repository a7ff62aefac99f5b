"""The data pipeline on Spark: the ``brokerlog`` data source and the jobs built on it.

    from brokerd import pipeline
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
    """Make ``format("brokerlog")`` available in this session (batch and streaming reads).

    Registration is per session because Spark keeps Python data sources in the session state; the
    pipeline's own jobs call this themselves.
    """
    from brokerd.pipeline.source import BrokerLogDataSource

    spark.dataSource.register(BrokerLogDataSource)

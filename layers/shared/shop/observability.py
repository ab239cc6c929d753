"""One logger, tracer and metrics instance per process, configured by the POWERTOOLS_* variables."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger()
tracer = Tracer()
metrics = Metrics()

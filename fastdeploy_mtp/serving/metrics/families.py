"""The Prometheus families every ``/metrics`` collector builds (named under FastDeploy's
``fastdeploy:`` prefix) and the text format they are served in (``prometheus_client``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "fastdeploy:"


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    """The counter ``fastdeploy:<name>`` (``_total`` in the text) holding ``value``."""
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    """The gauge ``fastdeploy:<name>`` holding ``value``."""
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def render(registry: CollectorRegistry) -> bytes:
    """Every collector of ``registry`` in Prometheus text format (what ``/metrics`` answers)."""
    return generate_latest(registry)

"""What a running ``twostage serve`` shows of itself: Prometheus metrics and one JSON access-log line a request.

``GET /metrics`` (text format of prometheus-client, a registry of the app's own, so two apps in one process never
share counters):

- ``twostage_requests_total{method, route, status}`` and ``twostage_request_errors_total{...}`` (status >= 400);
- ``twostage_request_seconds{method, route}``: a histogram of each request's time in the server;
- ``twostage_stage_seconds{stage}``: a histogram of each search stage per query (encode, bm25, dense, shards,
  merge, fuse, rerank, fetch, and their total), from the engine's own timings;
- ``twostage_model_calls_total{model}``, ``twostage_model_call_requests_total{model}``,
  ``twostage_model_call_items_total{model}``: calls of the cross-request batchers, the requests and items they
  carried (mean batch = requests / calls);
- ``twostage_engine_documents``, ``twostage_engine_info{version, retriever, reranker}`` (always 1), and
  ``twostage_model_load_seconds{model}``.

The access log is the logger ``twostage.access`` at INFO: one JSON object a request with ``request_id`` (the
client's ``X-Request-ID`` when it is a short token, else a new one; echoed in the response's ``X-Request-ID``),
method (``other`` for an unknown one, as in the metrics), path (at most 1,000 characters) status and
milliseconds. The library only logs it; ``twostage serve`` prints it (``--no-access-log``
silences it).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from twostage.indexer.errors import MissingDependencyError

access_log = logging.getLogger("twostage.access")
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
MAX_LOGGED_PATH = 1000  # characters of a request's path the access log keeps (a longer one is cut, marked "...")
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def method_label(method: str) -> str:
    """The HTTP method as a metric label: one of :data:`METHODS`, anything else ``other`` (a client choosing the
    label's values would grow ``/metrics`` without bound)."""
    return method if method in METHODS else "other"


def request_id(given: str | None) -> str:
    """The client's request id when it is a short token (letters, digits, ``._:-``), else a fresh one."""
    return given if given is not None and _ID.match(given) else uuid.uuid4().hex


class ServerMetrics:
    """The app's Prometheus registry and the instruments requests and searches feed."""

    def __init__(self, engine: Callable[[], Any], batchers: list[Any] | None = None,
                 load_seconds: dict[str, float] | None = None) -> None:
        """``batchers`` and ``load_seconds`` are read when scraped (the server updates them after a model swap)."""
        try:
            from prometheus_client import CollectorRegistry, Counter, Histogram
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingDependencyError("/metrics needs prometheus-client: pip install 'twostage-search[serve]' "
                                         "(or serve with --no-metrics)") from exc
        self.registry = CollectorRegistry()
        labels = ("method", "route", "status")
        self.requests = Counter("twostage_requests", "HTTP requests answered, by method, route and status", labels,
                                registry=self.registry)
        self.errors = Counter("twostage_request_errors", "HTTP requests answered with status >= 400", labels,
                              registry=self.registry)
        self.latency = Histogram("twostage_request_seconds", "Seconds a request spent in the server",
                                 ("method", "route"), buckets=_SECONDS, registry=self.registry)
        self.stages = Histogram("twostage_stage_seconds", "Seconds of each search stage, per query", ("stage",),
                                buckets=_SECONDS, registry=self.registry)
        self.load_seconds = load_seconds if load_seconds is not None else {}
        self.registry.register(_EngineCollector(engine, batchers if batchers is not None else [], self.load_seconds))

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method_label(method)
        self.requests.labels(method, route, str(status)).inc()
        if status >= 400:
            self.errors.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def observe_search(self, timings: Mapping[str, float]) -> None:
        for name, seconds in timings.items():
            self.stages.labels(name.removesuffix("_s")).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EngineCollector:
    """Gauges read when scraped: the served engine's version and size, the batchers' counts, model load times."""

    def __init__(self, engine: Callable[[], Any], batchers: list[Any], load_seconds: dict[str, float]) -> None:
        self.engine, self.batchers, self.load_seconds = engine, batchers, load_seconds

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        engine = self.engine()
        documents = GaugeMetricFamily("twostage_engine_documents", "Documents in the served engine version")
        documents.add_metric([], float(len(engine)))
        yield documents
        info = GaugeMetricFamily("twostage_engine_info", "The served engine version and its models (value 1)",
                                 labels=["version", "retriever", "reranker"])
        m = engine.manifest
        info.add_metric([engine.version, m.retriever.name if m.retriever else "none",
                         m.reranker.name if m.reranker else ""], 1.0)
        yield info
        loads = GaugeMetricFamily("twostage_model_load_seconds", "Seconds each model took to load and verify",
                                  labels=["model"])
        for model, seconds in self.load_seconds.items():
            loads.add_metric([model], seconds)
        yield loads
        for suffix, field, text in (("calls", "calls", "Model calls of the cross-request batcher"),
                                    ("call_requests", "requests", "Requests the batcher's model calls carried"),
                                    ("call_items", "items", "Texts or pairs the batcher's model calls carried")):
            family = CounterMetricFamily(f"twostage_model_{suffix}", text, labels=["model"])
            for b in self.batchers:
                family.add_metric([b.name], float(getattr(b.stats, field)))
            yield family


def log_access(rid: str, method: str, path: str, status: int, seconds: float, client: str | None) -> None:
    if access_log.isEnabledFor(logging.INFO):
        access_log.info(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "request_id": rid,
                                    "method": method_label(method), "path": path if len(path) <= MAX_LOGGED_PATH
                                    else path[:MAX_LOGGED_PATH] + "...", "status": status,
                                    "ms": round(seconds * 1000, 3), "client": client}, ensure_ascii=True))

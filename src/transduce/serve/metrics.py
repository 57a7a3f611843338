"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own per app.

transduce_requests_total{path,status}       requests answered
transduce_request_seconds{path}             latency histogram, queueing included
transduce_sentences_total{pair}             sentences translated
transduce_batch_requests / _batch_sentences requests and sentences per batch (histograms)
transduce_queue_depth                       requests queued or running, all models
transduce_models_loaded, transduce_model_bytes, transduce_model_loads, transduce_model_evictions (counts since start)
"""

from __future__ import annotations

try:
    from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
except ImportError as e:  # pragma: no cover - the serve extra is missing
    raise ImportError("transduce serve needs prometheus-client: pip install 'transduce[serve]'") from e

__all__ = ["CONTENT_TYPE", "Metrics"]
PATHS = ("/translate", "/languages", "/v1/translate", "/v1/attention", "/v1/models")  # others count as "other"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self, pool):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("transduce_requests", "HTTP requests answered", ["path", "status"], registry=r)
        self.latency = Histogram(
            "transduce_request_seconds",
            "request latency, queueing included",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.sentences = Counter("transduce_sentences", "sentences translated", ["pair"], registry=r)
        self.batch_requests = Histogram(
            "transduce_batch_requests", "requests per batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_sentences = Histogram(
            "transduce_batch_sentences", "sentences per batch", buckets=BATCH_BUCKETS, registry=r
        )
        Gauge("transduce_queue_depth", "requests queued or being translated, all models", registry=r).set_function(
            lambda: pool.pending
        )
        Gauge("transduce_models_loaded", "models in memory", registry=r).set_function(lambda: len(pool.loaded))
        Gauge("transduce_model_bytes", "bytes of the models in memory", registry=r).set_function(
            lambda: pool.used_bytes
        )
        Gauge("transduce_model_loads", "models loaded since start", registry=r).set_function(lambda: pool.loads)
        Gauge("transduce_model_evictions", "models unloaded for the memory budget", registry=r).set_function(
            lambda: pool.evictions
        )

    def observe(self, path: str, status: int, seconds: float) -> None:
        path = path if path in PATHS else "other"
        self.requests.labels(path, str(status)).inc()
        self.latency.labels(path).observe(seconds)

    def on_batch(self, pair: str):
        def observe(requests: int, sentences: int) -> None:
            self.batch_requests.observe(requests)
            self.batch_sentences.observe(sentences)
            self.sentences.labels(pair).inc(sentences)

        return observe

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""The server's Prometheus metrics (`GET /metrics`), in a registry of its own."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from nmt.serving.batching import BatchRecord

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

disable_created_metrics()  # the *_created series say when the server started, many times over


class Metrics:
    """Requests by endpoint and status, those aborted by their clients, latency, search
    batches and queue depth."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("nmt_requests", "HTTP requests answered",
                                ("endpoint", "code"), registry=self.registry)
        self.errors = Counter("nmt_request_errors", "HTTP requests answered with an error",
                              ("code",), registry=self.registry)
        self.aborts = Counter("nmt_requests_aborted", "requests whose client closed the "
                              "connection before the answer", ("endpoint",),
                              registry=self.registry)
        self.latency = Histogram("nmt_request_seconds", "time from request to answer",
                                 ("endpoint",), buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_sentences = Histogram("nmt_batch_sentences", "sentences per search call",
                                         ("pair",), buckets=SIZE_BUCKETS, registry=self.registry)
        self.batch_requests = Histogram("nmt_batch_requests", "requests per search call",
                                        ("pair",), buckets=SIZE_BUCKETS, registry=self.registry)
        self.batch_seconds = Histogram("nmt_batch_seconds", "seconds per search call",
                                       ("pair",), buckets=LATENCY_BUCKETS, registry=self.registry)
        self.sentences = Counter("nmt_sentences_translated", "sentences translated",
                                 ("pair",), registry=self.registry)
        self.queue = Gauge("nmt_queue_sentences", "sentences waiting for a search",
                           ("pair",), registry=self.registry)
        self.model_info = Gauge("nmt_model_info", "the engine and compute type serving a pair "
                                "(always 1)", ("pair", "engine", "compute_type"),
                                registry=self.registry)

    def observe_request(self, endpoint: str, code: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(code)).inc()
        if code >= 400:
            self.errors.labels(str(code)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def observe_abort(self, endpoint: str) -> None:
        """A request left unanswered because its client went away: no error of the server's."""
        self.aborts.labels(endpoint).inc()

    def describe_model(self, pair: str, engine: str, compute_type: str) -> None:
        """nmt_model_info{pair, engine, compute_type} 1: what serves each pair."""
        self.model_info.labels(pair, engine, compute_type).set(1)

    def observe_batch(self, pair: str, batch: BatchRecord) -> None:
        self.batch_sentences.labels(pair).observe(batch.sentences)
        self.batch_requests.labels(pair).observe(batch.requests)
        self.batch_seconds.labels(pair).observe(batch.seconds)
        self.sentences.labels(pair).inc(batch.sentences)

    def track_queue(self, pair: str, depth) -> None:
        """The queue gauge reads `depth()` whenever /metrics is scraped."""
        self.queue.labels(pair).set_function(depth)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

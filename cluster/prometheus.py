"""``GET /metrics`` on the API port: Prometheus text exposition of this replica's counters.

What this is: ``ApiMetrics``, a registry of its own (``prometheus_client``) that the server
feeds with finished requests and the orchestrator with verified rounds, and that renders the
text format. Names follow vLLM's where they mean the same, with the ``specdec:`` prefix
(``vllm:spec_decode_num_drafts`` -> ``specdec:spec_decode_num_drafts_total``). What it is not:
not the Ray metrics (``cluster.metrics``, exported by every Ray node's own agent), and not
summed across replicas (scrape each replica, or use the Ray metrics for cluster totals).

Terms: a *draft* is a round that sent at least one draft token to the target; *accepted per
position* counts, for each draft position i, the rounds that accepted position i. A *step* is
one batched target forward (continuous batching): ``specdec:iteration_tokens_total`` (vLLM's
name) and ``specdec:batch_size`` are observed once per step, the queue time once per call.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
QUEUE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
TOKENS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ApiMetrics:
    def __init__(self, model_id: str, kv_slots: int | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        labels, self.model, self.kv_slots = ["model_name"], model_id, kv_slots

        def counter(name, doc, extra=()):
            return Counter(f"specdec:{name}", doc, [*labels, *extra], registry=self.registry)

        def histogram(name, doc, buckets=LATENCY_BUCKETS):
            return Histogram(f"specdec:{name}", doc, labels, buckets=buckets,
                             registry=self.registry)

        def gauge(name, doc):
            return Gauge(f"specdec:{name}", doc, labels, registry=self.registry)

        self.success = counter("request_success", "finished requests", ["finished_reason"])
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens prefilled")
        self.generation_tokens = counter("generation_tokens", "tokens generated (committed)")
        self.e2e = histogram("e2e_request_latency_seconds", "request latency, arrival to end")
        self.ttft = histogram("time_to_first_token_seconds", "arrival to the first token")
        self.running = gauge("num_requests_running", "requests in flight")
        self.iteration_tokens = histogram("iteration_tokens_total", "tokens fed per target step",
                                          TOKENS_BUCKETS)
        self.batch_size = histogram("batch_size", "requests per target step", BATCH_BUCKETS)
        self.step_time = histogram("step_duration_seconds", "duration of a target step")
        self.queue_time = histogram("step_queue_time_seconds",
                                    "wait of a target call for its step", QUEUE_BUCKETS)
        self.slots_used = gauge("kv_slots_used", "KV cache slots held by requests")
        self.cache_usage = gauge("kv_cache_usage_perc", "share of the KV cache slots in use (0-1)")
        self.drafts = counter("spec_decode_num_drafts", "rounds that drafted tokens")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "draft tokens verified")
        self.accepted = counter("spec_decode_num_accepted_tokens", "draft tokens accepted")
        self.accepted_at = counter("spec_decode_num_accepted_tokens_per_pos",
                                   "rounds that accepted draft position i", ["position"])

    # ---- the orchestrator's observer hooks --------------------------------------------------
    def round(self, info) -> None:
        """One verified round (an ``actors.target.RoundInfo``)."""
        if not info.drafted:
            return
        self.drafts.labels(self.model).inc()
        self.draft_tokens.labels(self.model).inc(info.drafted)
        self.accepted.labels(self.model).inc(info.accepted)
        for i in range(info.accepted):
            self.accepted_at.labels(self.model, str(i)).inc()

    def finished(self, program) -> None:
        """One choice's round loop ended (its tokens are counted per request, below)."""

    def step(self, info) -> None:
        """One target step (an ``actors.scheduler.StepInfo``), observed once."""
        self.iteration_tokens.labels(self.model).observe(info.tokens)
        self.batch_size.labels(self.model).observe(info.batch)
        self.step_time.labels(self.model).observe(info.seconds)
        self.slots_used.labels(self.model).set(info.slots_used)
        if self.kv_slots:
            self.cache_usage.labels(self.model).set(info.slots_used / self.kv_slots)

    def queued(self, seconds: float) -> None:
        self.queue_time.labels(self.model).observe(seconds)

    # ---- the server's hooks -----------------------------------------------------------------
    def first_token(self, seconds: float) -> None:
        self.ttft.labels(self.model).observe(seconds)

    def request(self, prompt_tokens: int, generated: int, finish_reason: str | None,
                seconds: float) -> None:
        """One HTTP request done; finish_reason None: it failed or the client left."""
        self.success.labels(self.model, finish_reason or "abort").inc()
        self.prompt_tokens.labels(self.model).inc(prompt_tokens)
        self.generation_tokens.labels(self.model).inc(generated)
        self.e2e.labels(self.model).observe(seconds)

    def exposition(self, running: int) -> bytes:
        self.running.labels(self.model).set(running)
        return generate_latest(self.registry)


class Fanout:
    """Several orchestrator observers as one."""

    def __init__(self, *observers):
        self.observers = [o for o in observers if o is not None]

    def round(self, info) -> None:
        for o in self.observers:
            o.round(info)

    def finished(self, program) -> None:
        for o in self.observers:
            o.finished(program)

    def step(self, info) -> None:
        for o in self.observers:
            o.step(info)

    def queued(self, seconds: float) -> None:
        for o in self.observers:
            o.queued(seconds)

"""Serving metrics through Ray's metrics API (exported to Prometheus by every Ray node).

``ServeMetrics`` is the orchestrator's observer: it counts requests, rounds, drafted and
accepted tokens, and records histograms of the accepted length and the draft length per round
and of the time per round spent in the drafter and the target; for the target's continuous
batching, per step the requests and tokens in it, per call its queue wait, and the KV slots in
use. It also keeps plain running totals that ``GET /debug/metrics`` returns (with the batch
means), so the plumbing can be checked without a Prometheus scrape.
"""

from __future__ import annotations

from collections import Counter

from ray.util import metrics

LENGTH_BOUNDARIES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
SECONDS_BOUNDARIES = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]
TOKENS_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
QUEUE_BOUNDARIES = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]


class ServeMetrics:
    def __init__(self, model_id: str):
        tags = {"model": model_id}
        self.totals: Counter = Counter()

        def counter(name, doc):
            c = metrics.Counter(f"specdec_{name}", description=doc, tag_keys=("model",))
            c.set_default_tags(tags)
            return c

        def histogram(name, doc, bounds):
            h = metrics.Histogram(f"specdec_{name}", description=doc, boundaries=bounds,
                                  tag_keys=("model",))
            h.set_default_tags(tags)
            return h

        self.requests = counter("requests", "finished requests")
        self.rounds = counter("rounds", "draft/verify rounds")
        self.drafted = counter("drafted_tokens", "draft tokens sent to the target")
        self.accepted = counter("accepted_tokens", "draft tokens the target accepted")
        self.accepted_length = histogram("accepted_length", "tokens committed per round",
                                         LENGTH_BOUNDARIES)
        self.draft_length = histogram("draft_length", "draft tokens per round", LENGTH_BOUNDARIES)
        self.drafter_s = histogram("round_drafter_seconds", "drafter time per round",
                                   SECONDS_BOUNDARIES)
        self.target_s = histogram("round_target_seconds", "target time per round",
                                  SECONDS_BOUNDARIES)
        self.batch_size = histogram("batch_size", "requests per target step", LENGTH_BOUNDARIES)
        self.step_tokens = histogram("step_tokens", "tokens fed per target step",
                                     TOKENS_BOUNDARIES)
        self.step_s = histogram("step_seconds", "duration of a target step", SECONDS_BOUNDARIES)
        self.queue_s = histogram("queue_wait_seconds", "wait of a target call for its step",
                                 QUEUE_BOUNDARIES)
        self.slots_used = metrics.Gauge("specdec_kv_slots_used", description="KV slots in use "
                                        "after the last target step", tag_keys=("model",))
        self.slots_used.set_default_tags(tags)

    def round(self, info) -> None:
        """One verified round (an ``actors.target.RoundInfo``)."""
        drafted, accepted = info.drafted, info.accepted
        self.rounds.inc()
        if drafted:
            self.drafted.inc(drafted)
        if accepted:
            self.accepted.inc(accepted)
        self.accepted_length.observe(info.committed)
        self.draft_length.observe(drafted)
        self.drafter_s.observe(info.drafter_s)
        self.target_s.observe(info.target_s)
        self.totals.update(rounds=1, drafted=drafted, accepted=accepted,
                           committed=info.committed)

    def step(self, info) -> None:
        """One target step (an ``actors.scheduler.StepInfo``), observed once."""
        self.batch_size.observe(info.batch)
        self.step_tokens.observe(info.tokens)
        self.step_s.observe(info.seconds)
        self.slots_used.set(info.slots_used)
        self.totals.update(steps=1, step_requests=info.batch, step_tokens=info.tokens)
        self.totals["step_s"] += info.seconds
        self.totals["slots_used"] = info.slots_used

    def queued(self, seconds: float) -> None:
        self.queue_s.observe(seconds)
        self.totals.update(queued_calls=1)
        self.totals["queue_wait_s"] += seconds

    def finished(self, program) -> None:
        self.requests.inc()
        self.totals.update(requests=1)

    def snapshot(self) -> dict:
        out = dict(self.totals)
        if self.totals["steps"]:
            out["mean_batch_size"] = self.totals["step_requests"] / self.totals["steps"]
            out["mean_step_tokens"] = self.totals["step_tokens"] / self.totals["steps"]
            out["mean_step_s"] = self.totals["step_s"] / self.totals["steps"]
        if self.totals["queued_calls"]:
            out["mean_queue_wait_s"] = self.totals["queue_wait_s"] / self.totals["queued_calls"]
        return out

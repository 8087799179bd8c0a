"""Serving metrics through Ray's metrics API (exported to Prometheus by every Ray node).

``ServeMetrics`` is the orchestrator's observer: it counts requests, rounds, drafted and
accepted tokens, and records histograms of the accepted length and the draft length per round
and of the time per round spent in the drafter and the target. It also keeps plain running
totals that ``GET /debug/metrics`` returns, so the plumbing can be checked without a
Prometheus scrape.
"""

from __future__ import annotations

from collections import Counter

from ray.util import metrics

LENGTH_BOUNDARIES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
SECONDS_BOUNDARIES = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]


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

    def round(self, draft, result, seconds: float) -> None:
        """One verified round: draft is a workers.Draft, result a workers.RoundResult."""
        drafted, accepted = len(draft.tokens), result.accepted
        self.rounds.inc()
        if drafted:
            self.drafted.inc(drafted)
        if accepted:
            self.accepted.inc(accepted)
        self.accepted_length.observe(len(result.tokens))
        self.draft_length.observe(drafted)
        self.drafter_s.observe(draft.drafter_s + draft.preverifier_s)
        self.target_s.observe(result.target_s)
        self.totals.update(rounds=1, drafted=drafted, accepted=accepted,
                           committed=len(result.tokens))

    def finished(self, progress) -> None:
        self.requests.inc()
        self.totals.update(requests=1)

    def snapshot(self) -> dict:
        return dict(self.totals)

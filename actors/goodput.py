"""Load-aware speculation by goodput: how many tokens of each draft a target step verifies.

A draft token is worth verifying when the tokens it is expected to add outweigh what its row
adds to the step's time, priced at what the target's time is worth: the tokens it commits per
second. Three measured things price it:

- ``StepCost``: a pass's time against its new tokens, measured on the target's own runtime at
  load (one request of n tokens, the fastest of a few runs). Its shape is the machine's: where a
  pass streams its weights from memory, rows are almost free until the linear's compute shows;
  where a pass is compute-bound, each row costs its share.
- ``Goodput.rate``: the tokens the recent steps committed per second of step time spent on
  them: a prompt chunk's share (its tokens' cost on ``StepCost``) is left out, since a prompt is
  prefilled whether its neighbours draft or not. Counted in, it priced the target's time at what
  decoding and prefilling together make of it: where prompt chunks fill much of the steps, the
  rate read far below what decoding made, and no draft was cut where verifying the drafts'
  tokens cost more than they saved.
- A draft token's chance to be committed: its survival by the acceptance model where the
  request has one on (``specdec.models.acceptance``: trained on what the verifier accepted, so
  taken as it is); else the drafter's own confidence where it gives one (the suffix tree's path
  probability), scaled by how the drafts' confidence has matched what was accepted; else the
  rate at which tokens at its depth were accepted.

``fit_drafts`` then keeps, of all the step's draft tokens taken best first, the count that
maximises their expected tokens less the step's cost, priced at ``Goodput.price`` (the rate,
and at least what plain decoding of the step's requests makes of a second): with cheap rows at
one client a draft stays whole, and as the batch grows the least likely tokens go first. Only the
drafts a target makes itself are cut, and only for requests whose tokens do not depend on their
drafts (greedy, lossless verification): a request's output is the same whatever its load.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

COST_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96)  # new tokens per measured pass
CONTEXT = 64  # cached tokens before each measured pass
DEPTHS = 64  # deepest draft position with its own acceptance average
DECAY = 0.95  # what a step's observations weigh a step later (about the last 20 steps count)
PRIOR = 2.0  # the prior's weight, in tokens of observation


@dataclass(frozen=True)
class StepCost:
    """Seconds of a pass against the new tokens it feeds: linear between measured sizes, the
    last segment's slope past them (non-decreasing)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self):
        if len(self.sizes) < 2 or len(self.sizes) != len(self.seconds) or \
                list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError("a step cost needs two or more increasing sizes, one time each")

    def __call__(self, tokens: int) -> float:
        s, t = self.sizes, self.seconds
        i = min(max(bisect.bisect_left(s, tokens), 1), len(s) - 1)
        slope = (t[i] - t[i - 1]) / (s[i] - s[i - 1])
        return max(t[0], t[i - 1] + slope * (tokens - s[i - 1]))

    @classmethod
    def measure(cls, forward, sizes: Sequence[int] = COST_SIZES, repeats: int = 3,
                extra: Sequence[int] = ()) -> StepCost:
        """Time ``forward`` (a ``specdec.runtime.Forward``) on one request of each size after
        ``CONTEXT`` cached tokens, logits at every position, as a verify asks; the fastest of
        ``repeats`` sweeps. ``extra``: more sizes (a batch-invariant linear's piece edges). It
        borrows one KV slot and gives it back."""
        from specdec.runtime import Row  # the runtime only where one runs

        sizes = sorted({*sizes, *extra})
        pool = forward.pool
        slot = pool.acquire()
        try:
            forward([Row(slot, [1] * CONTEXT, logits_at=[CONTEXT - 1], chunk=True)])
            best = [float("inf")] * len(sizes)
            for _ in range(1 + repeats):  # the first sweep warms up, and counts too
                for j, n in enumerate(sizes):
                    ids = [(7 * i) % 97 + 2 for i in range(n)]
                    t0 = time.perf_counter()
                    forward([Row(slot, ids, logits_at=range(n))])
                    best[j] = min(best[j], time.perf_counter() - t0)
                    pool.crop(slot, CONTEXT)
        finally:
            pool.crop(slot, 0)
            pool.release(slot)
        for j in range(1, len(best)):  # more tokens never cost less
            best[j] = max(best[j], best[j - 1])
        return cls(tuple(sizes), tuple(best))


@dataclass
class Goodput:
    """What a target step's time is worth and how far drafts are accepted: sums over the steps
    that fade by ``DECAY`` a step, each read against a prior of fixed weight (one token a
    one-token pass; confidence taken at its word; half the tokens at each further depth). With
    nothing drafted for a while the sums fade and the prior returns, so drafts cut to nothing
    are tried again: a bad spell never stops speculation for good."""

    cost: StepCost
    tokens: float = 0.0  # committed
    seconds: float = 0.0  # of step time
    expected: float = 0.0  # confident drafts: their summed confidence
    accepted: float = 0.0  # ... and the tokens accepted of them
    # per depth d, drafts without confidence: tokens drafted there, and accepted
    depth_seen: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)
    depth_kept: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)

    @property
    def rate(self) -> float:
        """Tokens committed per second of step."""
        return (self.tokens + PRIOR) / (self.seconds + PRIOR * self.cost(1))

    def price(self, requests: int) -> float:
        """What a second of the step is worth, in tokens, for a step of ``requests`` rounds: the
        recent ``rate``, and at least what plain decoding of those requests would make of it
        (``requests`` tokens in ``cost(requests)``). The floor keeps drafts from pricing
        themselves: long drafts slow the steps, the slower steps' rate priced their rows low, and
        the drafts stayed long (docs/RESULTS.md#serve-defaults-chosen-by-measurement)."""
        plain = requests / self.cost(requests) if requests else 0.0
        return max(self.rate, plain)

    @property
    def calibration(self) -> float:
        """Accepted tokens per unit of the drafts' confidence."""
        return (self.accepted + PRIOR) / (self.expected + PRIOR)

    def step(self, tokens: int, seconds: float, fed: int = 0, prefilled: int = 0) -> None:
        """A step that committed ``tokens`` in ``seconds``, feeding ``fed`` tokens of rounds and
        ``prefilled`` of prompt chunks (whose cost is taken off); the older steps fade."""
        if prefilled:
            seconds = max(0.0, seconds - (self.cost(fed + prefilled) - self.cost(fed)))
        self.tokens = DECAY * self.tokens + tokens
        self.seconds = DECAY * self.seconds + seconds
        self.expected *= DECAY
        self.accepted *= DECAY
        self.depth_seen = [DECAY * n for n in self.depth_seen]
        self.depth_kept = [DECAY * n for n in self.depth_kept]

    def round(self, confidence: Sequence[float] | None, drafted: int, accepted: int,
              survival: Sequence[float] | None = None) -> None:
        """A verified draft of ``drafted`` tokens (their confidence, if any) and its accepted;
        a draft priced by its ``survival`` teaches nothing here."""
        if survival is not None:
            return
        if confidence is not None:
            self.expected += sum(confidence[:drafted])
            self.accepted += accepted
            return
        for d in range(min(drafted, DEPTHS)):
            self.depth_seen[d] += 1
            self.depth_kept[d] += d < accepted

    def values(self, drafted: int, confidence: Sequence[float] | None,
               survival: Sequence[float] | None = None) -> list[float]:
        """Each draft token's expected committed tokens (non-increasing along the draft)."""
        if survival is not None:
            raw = list(survival[:drafted])
        elif confidence is not None:
            c = self.calibration
            raw = [min(1.0, c * p) for p in confidence[:drafted]]
        else:
            raw = []
            for d in range(drafted):
                seen, kept = ((self.depth_seen[d], self.depth_kept[d]) if d < DEPTHS else (0, 0))
                raw.append((kept + PRIOR * 0.5 ** (d + 1)) / (seen + PRIOR))
        out, low = [], 1.0
        for v in raw:
            low = min(low, v)
            out.append(low)
        return out


def fit_drafts(values: list[list[float]], fixed: int, cost: StepCost, rate: float) -> list[int]:
    """How many tokens each draft keeps: ``values[i]`` its tokens' expected committed tokens
    (non-increasing), ``fixed`` the step's other tokens (bonus rows, decodes, prompt chunks).
    Takes the step's draft tokens best first (ties: the shallower first) and keeps the count
    that maximises their expected tokens less ``rate`` times the step's cost, the first such
    count (a step's cost may jump, as at a linear's piece edge: every count is tried)."""
    order = sorted(((-v, d, i) for i, vs in enumerate(values) for d, v in enumerate(vs)))
    best_k, best, gained = 0, -rate * cost(fixed), 0.0
    for k, (neg, _, _) in enumerate(order, start=1):
        gained -= neg
        score = gained - rate * cost(fixed + k)
        if score > best:
            best_k, best = k, score
    keep = [0] * len(values)
    for _, _, i in order[:best_k]:
        keep[i] += 1
    return keep

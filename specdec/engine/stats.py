"""Per-request statistics of speculative decoding, filled in round by round."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace


@dataclass
class RequestStats:
    rounds: int = 0
    drafted: int = 0  # draft tokens sent to the target
    accepted: int = 0  # draft tokens accepted
    committed: int = 0  # tokens emitted (accepted drafts + bonus tokens, after truncation)
    target_passes: int = 0  # target forwards, the prefill included
    regret_spent: float = 0.0  # ASD ledger at the end
    exceptions: int = 0  # ASD accepted mismatches
    accepted_at: list[int] = field(default_factory=list)  # [i]: rounds that accepted position i
    drafted_at: list[int] = field(default_factory=list)  # [i]: rounds that drafted position i
    draft_lengths: Counter = field(default_factory=Counter)  # draft length -> rounds
    draft_sources: Counter = field(default_factory=Counter)  # source -> rounds (suffix, hybrid)
    drafter_s: float = 0.0
    preverifier_s: float = 0.0
    target_s: float = 0.0
    total_s: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per round (accepted drafts + the bonus); 1.0 for plain decoding."""
        return self.committed / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.committed / self.total_s if self.total_s else 0.0

    def record_round(self, drafted: int, accepted: int, regret: float, exceptions: int,
                     passes: int = 1):
        self.rounds += 1
        self.target_passes += passes
        self.drafted += drafted
        self.accepted += accepted
        self.regret_spent += regret
        self.exceptions += exceptions
        self.draft_lengths[drafted] += 1
        grow = max(0, drafted - len(self.drafted_at))
        self.drafted_at.extend([0] * grow)
        self.accepted_at.extend([0] * grow)
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1

    def snapshot(self) -> RequestStats:
        """A copy that later rounds leave as it is."""
        return replace(self, accepted_at=list(self.accepted_at), drafted_at=list(self.drafted_at),
                       draft_lengths=Counter(self.draft_lengths),
                       draft_sources=Counter(self.draft_sources))

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "committed": self.committed, "target_passes": self.target_passes,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "accepted_per_position": list(self.accepted_at),
            "drafted_per_position": list(self.drafted_at),
            "draft_length_histogram": {str(k): v for k, v in sorted(self.draft_lengths.items())},
            "draft_sources": dict(sorted(self.draft_sources.items())),
            "regret_spent": round(self.regret_spent, 6), "exceptions": self.exceptions,
            "time_s": {"drafter": round(self.drafter_s, 4), "preverifier": round(self.preverifier_s, 4),
                       "target": round(self.target_s, 4), "total": round(self.total_s, 4)},
            "tokens_per_s": round(self.tokens_per_s, 2),
        }

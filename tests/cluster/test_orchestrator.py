"""The replica's view of a served request (``cluster.orchestrator.Served``): what the target
streams, cut at the first stop string, with stats and log probabilities of the kept tokens."""

from __future__ import annotations

from actors.target import Progress
from cluster.orchestrator import Served
from specdec.engine.logprobs import TokenLogprobs
from specdec.engine.settings import GenerationParams
from specdec.engine.stats import RequestStats
from specdec.engine.stops import StopStrings


def letters(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids)


def message(tokens: list[int], rounds: int, finish: str | None = None) -> Progress:
    stats = RequestStats(rounds=rounds, committed=99)  # the target's count, before any cut
    lp = TokenLogprobs([-0.5] * len(tokens), [[t] for t in tokens], [[-0.5]] * len(tokens))
    return Progress(tokens, lp, (), (), stats, finish, 0.01)


def test_a_stop_string_ends_the_request_at_the_token_that_completes_it():
    served = Served([7], GenerationParams(max_new_tokens=10, logprobs=1),
                    StopStrings(["cd"], letters))
    assert served.add(message([0, 1], 1)) == [0, 1] and served.finish_reason is None
    assert served.add(message([2, 3, 4], 2)) == [2, 3]  # "abcd": the stop ends at token 3
    assert served.finish_reason == "stop" and served.token_ids == [0, 1, 2, 3]
    assert (served.stats.rounds, served.stats.committed) == (2, 4)  # only kept tokens count
    assert served.all_logprobs().top_ids == [[0], [1], [2], [3]]


def test_without_stops_it_takes_the_targets_tokens_and_finish_reason():
    served = Served([7], GenerationParams(max_new_tokens=3))
    assert served.add(message([0, 1, 2], 3, "length")) == [0, 1, 2]
    assert served.finish_reason == "length" and served.all_logprobs() is None
    assert served.stats.committed == 3

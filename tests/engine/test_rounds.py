"""The round program alone, against a scripted fake worker that answers its steps."""

from __future__ import annotations

from specdec.engine import rounds
from specdec.engine.settings import GenerationParams
from specdec.engine.workers import Draft, RoundResult

EOS = frozenset({9})


class Script:
    """A fake target + drafter pair: drafts ``draft`` tokens (at most the limit), accepts
    ``accept`` of them and adds a bonus from ``bonus``; the context has ``room`` tokens."""

    def __init__(self, room=100, cap=None, draft=(5, 5, 5, 5), accept=2, bonus=(7, 7, 7, 7, 7)):
        self.room, self.cap, self.draft, self.accept = room, cap, list(draft), accept
        self.bonus = list(bonus)
        self.steps: list = []

    def answer(self, step):
        self.steps.append(step)
        if isinstance(step, rounds.Open):
            return rounds.Opened(self.room, target_s=1.0, drafter_s=0.5, draft_cap=self.cap)
        if isinstance(step, rounds.Propose):
            return Draft(self.draft[: max(0, step.limit)], None, drafter_s=0.25)
        if isinstance(step, rounds.Verify):
            k = min(self.accept, len(step.draft.tokens))
            tokens = step.draft.tokens[:k] + [self.bonus.pop(0) if self.bonus else 7]
            self.room -= k + 1
            result = RoundResult(tokens, k, 0.0, 0, None, target_s=2.0)
            return rounds.Verified(result, self.room, self.cap)
        if isinstance(step, rounds.Commit):
            return 0.125
        return None


def drive(program: rounds.RoundProgram, script: Script) -> list:
    steps = program.steps(EOS)
    step = next(steps)
    while not isinstance(step, rounds.Finish):
        step = steps.send(script.answer(step))
    script.steps.append(step)
    return script.steps


def kinds(steps) -> list[str]:
    return [type(s).__name__ for s in steps]


def test_a_round_is_propose_verify_emit_commit_and_the_last_ends_with_finish():
    program = rounds.RoundProgram([1, 2, 3], GenerationParams(max_new_tokens=6))
    steps = drive(program, Script())
    assert kinds(steps) == ["Open", "Propose", "Verify", "Emit", "Commit",
                            "Propose", "Verify", "Emit", "Finish"]
    assert steps[0] == rounds.Open([1, 2, 3], program.params)
    assert [s.limit for s in steps if isinstance(s, rounds.Propose)] == [5, 2]  # budget - 1
    assert [s.tokens for s in steps if isinstance(s, rounds.Emit)] == [[5, 5, 7], [5, 5, 7]]
    assert steps[-1] == rounds.Finish("length") and program.finish_reason == "length"
    assert program.token_ids == [5, 5, 7, 5, 5, 7]


def test_the_stats_are_the_programs():
    program = rounds.RoundProgram([1], GenerationParams(max_new_tokens=6))
    drive(program, Script())
    s = program.stats
    assert (s.rounds, s.drafted, s.accepted, s.committed, s.target_passes) == (2, 6, 4, 6, 3)
    assert s.target_s == 1.0 + 2 * 2.0
    assert s.drafter_s == 0.5 + 2 * 0.25 + 0.125  # open, two drafts, one commit


def test_eos_cuts_the_round_and_finishes_with_stop():
    program = rounds.RoundProgram([1], GenerationParams(max_new_tokens=50))
    steps = drive(program, Script(draft=(5, 9, 5), accept=3))
    assert program.token_ids == [5, 9] and steps[-1] == rounds.Finish("stop")


def test_stop_token_ids_end_the_output_like_eos():
    params = GenerationParams(max_new_tokens=50, stop_token_ids=frozenset({7}))
    program = rounds.RoundProgram([1], params)
    drive(program, Script())
    assert program.token_ids == [5, 5, 7] and program.finish_reason == "stop"


def test_the_draft_is_capped_and_a_full_context_finishes_with_length():
    program = rounds.RoundProgram([1], GenerationParams(max_new_tokens=50))
    steps = drive(program, Script(room=4, cap=3, accept=4))
    limits = [s.limit for s in steps if isinstance(s, rounds.Propose)]
    assert limits == [3, 0]  # min(budget - 1, room 4, cap 3), then the context is full
    assert program.finish_reason == "length" and program.token_ids == [5, 5, 5, 7, 7]


def test_no_drafter_is_plain_decoding_with_empty_drafts():
    program = rounds.RoundProgram([1], GenerationParams(max_new_tokens=3))
    steps = drive(program, Script(draft=()))
    assert kinds(steps).count("Verify") == 3 and program.token_ids == [7, 7, 7]
    assert program.stats.drafted == 0 and program.stats.mean_accepted_length == 1.0

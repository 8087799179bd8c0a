"""Simulated speculative decoding that records every drafted token (PACER's training data).

It drives the round program (``specdec.engine.rounds.RoundProgram``: limits, EOS and budget,
finishing) with its own answers: direct model calls under the same cache invariant as
``specdec.engine.workers`` (the target caches S[:-1], the last verified token is pending; one
pass over [pending, x_0..x_{K-1}] gives logits z_0..z_K). It drafts the drafter's full window
every round (the program's draft cap is the window, so that every position gets labels) and
keeps, per drafted token x_i, from its own verify answers:

- the drafter's hidden state (the pre-verifier's input) and the token's position i in the draft,
- the PACER block index i // b,
- the target's greedy token y*_i = argmax z_i and the regret r_i = z_i(y*_i) - z_i(x_i) >= 0,
- the label: 1 iff the verifier in use accepted x_i (i < accepted), else 0.

With an acceptance model (``specdec.models.acceptance``) the recorded "hidden state" is instead
its features: the target's root state (tapped, as the served target taps it, at the position
whose logits gave the pending token), the target's embedding of x_i, and the drafter's own
signals; an acceptance model is trained on the tokens whose predecessors were all accepted.

What this is not: no Ray, no Parquet (``pipelines.simulate`` maps this over prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdec.algorithms.sampling import Sampling
from specdec.algorithms.verify import Verifier, VerifyInputs
from specdec.engine import rounds
from specdec.engine.settings import GenerationParams
from specdec.engine.workers import Draft, RoundResult
from specdec.models.acceptance import AcceptanceModel, root_of
from specdec.models.drafter import Drafter
from specdec.models.target import TargetModel


@dataclass(frozen=True)
class TokenRecord:
    step: int  # round index within the request
    position: int  # i, position in the draft
    block: int  # i // b, PACER block
    token: int  # x_i
    greedy: int  # y*_i
    regret: float  # z_i(y*_i) - z_i(x_i)
    accepted: int  # 1 if the verifier accepted x_i
    hidden: list[float]  # [D] drafter hidden state


def round_records(step: int, draft, logits: torch.Tensor, accepted: int,
                  pacer_block: int) -> list[TokenRecord]:
    """draft: DraftBlock of K tokens; logits: [K+1, V] raw, on the draft's device -> K records."""
    k = len(draft)
    z = logits[:k].double()  # [K, V]
    greedy = z.argmax(-1)  # [K]
    regret = (z.gather(1, greedy[:, None]) - z.gather(1, draft.tokens[:k, None]))[:, 0]  # [K]
    hidden = draft.hidden.float().tolist()
    return [TokenRecord(step, i, i // pacer_block, int(draft.tokens[i]), int(greedy[i]),
                        float(regret[i]), int(i < accepted), hidden[i]) for i in range(k)]


class _Simulator:
    """Answers the round program's steps with direct model calls, and keeps every round's
    records. It sees the target's logits and the drafter's hidden states, which the served
    workers never hand out; its context room is one token more conservative than the
    ``TargetWorker``'s (as this simulation always was)."""

    def __init__(self, target_model: TargetModel, draft_model: Drafter, verifier: Verifier,
                 draft_len: int, pacer_block: int, acceptance: AcceptanceModel | None = None):
        self.target_model, self.draft_model = target_model, draft_model
        self.verifier = verifier
        self.draft_len, self.pacer_block = draft_len, pacer_block
        self.greedy = Sampling(0.0, torch.Generator().manual_seed(0))
        self.acceptance = acceptance
        self.taps = draft_model.needs_target_features or acceptance is not None
        self.records: list[TokenRecord] = []
        self.round_index = 0

    def answer(self, step: rounds.Step):
        match step:
            case rounds.Open(prompt_ids):
                return self.open(prompt_ids)
            case rounds.Propose(limit):
                self.block = self.draft_model.propose(self.dstate, max(0, limit), self.greedy)
                return Draft(self.block.tokens.tolist(), None)
            case rounds.Verify():
                return self.verify(self.block)
            case rounds.Commit(result):
                self.draft_model.commit(self.dstate, result.tokens, result.features)
                self.rooted(result.features)
        return None  # Emit

    def rooted(self, taps: torch.Tensor | None) -> None:
        """The next draft's root state, from the taps its drafter was handed."""
        if self.acceptance is not None:
            self.root = root_of(taps, self.acceptance.config.root_size)

    def recorded(self, block):
        """The block as its records hold it: the acceptance model's features as its hidden."""
        if self.acceptance is None:
            return block
        features = self.acceptance.features(self.root, block.tokens, block.hidden)
        return replace(block, hidden=features)

    def open(self, prompt_ids: list[int]) -> rounds.Opened:
        """Cache the prompt but its last token (pending); the drafter starts on the prompt."""
        self.state = self.target_model.new_state()
        features = self.target_model.forward(self.state, prompt_ids[:-1], taps=self.taps,
                                       last_logits_only=True).taps
        self.dstate = self.draft_model.start(list(prompt_ids), features)
        self.rooted(features)
        self.vstate, self.pending = self.verifier.new_state(), prompt_ids[-1]
        return rounds.Opened(self.room(), draft_cap=self.draft_len)  # full-window drafts

    def verify(self, block) -> rounds.Verified:
        """One pass over [pending, *draft]: logits z_0..z_K; verify, record, crop."""
        start = self.state.length
        ids = [self.pending, *block.tokens.tolist()]
        out = self.target_model.forward(self.state, ids, taps=self.taps)
        # The device boundary, as in the TargetWorker: verification and the records run on
        # the CPU, where the draft and the request's generator live, whatever the target's device.
        logits = out.logits.cpu()  # [K+1, V]
        verdict = self.verifier.verify(self.vstate, VerifyInputs(logits, block.tokens))
        self.records += round_records(self.round_index, self.recorded(block), logits,
                                      verdict.accepted, self.pacer_block)
        self.target_model.crop(self.state, start + 1 + verdict.accepted)
        self.pending, self.round_index = verdict.tokens[-1], self.round_index + 1
        features = None if out.taps is None else out.taps[: verdict.accepted + 1]
        result = RoundResult(verdict.tokens, verdict.accepted, verdict.regret, verdict.exceptions,
                             features)
        return rounds.Verified(result, self.room(), draft_cap=self.draft_len)

    def room(self) -> int:
        return self.target_model.max_length - self.state.length - 2


def simulate_request(target_model: TargetModel, draft_model: Drafter, verifier: Verifier,
                     prompt_ids: list[int], max_new_tokens: int, draft_len: int,
                     pacer_block: int = 4,
                     acceptance: AcceptanceModel | None = None) -> list[TokenRecord]:
    """Greedy SD over one prompt; every round drafts ``draft_len`` tokens (fewer near the end,
    or where the drafter finds fewer). With ``acceptance`` (its weights unused) the records
    hold its features (module docstring); the target must tap its root layer."""
    if len(prompt_ids) < 2:
        raise ValueError("simulation needs a prompt of at least 2 tokens")
    if acceptance is not None:
        acceptance.check(target_model, draft_model)
    sim = _Simulator(target_model, draft_model, verifier, draft_len, pacer_block, acceptance)
    program = rounds.RoundProgram(prompt_ids, GenerationParams(max_new_tokens=max_new_tokens))
    try:
        for _ in rounds.drive(program.steps(target_model.eos_token_ids), sim.answer):
            pass
    finally:
        finish = getattr(draft_model, "finish", None)  # the suffix drafter's local tree goes
        if finish is not None and hasattr(sim, "dstate"):
            finish(sim.dstate)
    return sim.records

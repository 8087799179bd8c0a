"""Simulated speculative decoding that records every drafted token (PACER's training data).

The same round as ``specdec.engine.workers`` (cache invariant: the target caches S[:-1], the last
verified token is pending; one pass over [pending, x_0..x_{K-1}] gives logits z_0..z_K), but it
drafts the drafter's full window every round (so that every position gets labels) and keeps, per
drafted token x_i:

- the drafter's hidden state (the pre-verifier's input) and the token's position i in the draft,
- the PACER block index i // b,
- the target's greedy token y*_i = argmax z_i and the regret r_i = z_i(y*_i) - z_i(x_i) >= 0,
- the label: 1 iff the verifier in use accepted x_i (i < accepted), else 0.

What this is not: no Ray, no Parquet (``pipelines.simulate`` maps this over prompts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.algorithms.sampling import Sampling
from specdec.algorithms.verify import Verifier, VerifyInputs
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
    """draft: DraftBlock of K tokens; logits: [K+1, V] raw -> K records."""
    k = len(draft)
    z = logits[:k].double()  # [K, V]
    greedy = z.argmax(-1)  # [K]
    regret = (z.gather(1, greedy[:, None]) - z.gather(1, draft.tokens[:k, None]))[:, 0]  # [K]
    hidden = draft.hidden.float().tolist()
    return [TokenRecord(step, i, i // pacer_block, int(draft.tokens[i]), int(greedy[i]),
                        float(regret[i]), int(i < accepted), hidden[i]) for i in range(k)]


def simulate_request(target: TargetModel, drafter: Drafter, verifier: Verifier,
                     prompt_ids: list[int], max_new_tokens: int, draft_len: int,
                     pacer_block: int = 4) -> list[TokenRecord]:
    """Greedy SD over one prompt; every round drafts ``draft_len`` tokens (fewer near the end)."""
    if len(prompt_ids) < 2:
        raise ValueError("simulation needs a prompt of at least 2 tokens")
    greedy = Sampling(0.0, torch.Generator().manual_seed(0))
    state = target.new_state()
    taps = drafter.needs_target_features
    features = target.forward(state, prompt_ids[:-1], taps=taps, last_logits_only=True).taps
    dstate = drafter.start(list(prompt_ids), features)
    pending, produced, records, step = prompt_ids[-1], 0, [], 0
    vstate = verifier.new_state()  # the verifier's per-request state (ASD: the ledger)
    eos = target.eos_token_ids
    while produced < max_new_tokens:
        room = min(draft_len, max_new_tokens - produced - 1, target.max_length - state.length - 2)
        draft = drafter.propose(dstate, max(0, room), greedy)
        start = state.length
        out = target.forward(state, [pending, *draft.tokens.tolist()], taps=taps)
        verdict = verifier.verify(vstate, VerifyInputs(out.logits, draft.tokens))
        records += round_records(step, draft, out.logits, verdict.accepted, pacer_block)
        target.crop(state, start + 1 + verdict.accepted)
        pending, produced, step = verdict.tokens[-1], produced + len(verdict.tokens), step + 1
        if eos & set(verdict.tokens) or room < 1:
            break
        feats = None if out.taps is None else out.taps[: verdict.accepted + 1]
        drafter.commit(dstate, verdict.tokens, feats)
    return records

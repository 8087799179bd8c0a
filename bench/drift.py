"""A reference-free measure of how far an approximate method drifts from the target.

HumanEval pass@1 cannot tell ASD's budgets apart when the target solves a few problems (the
135M target: 3 of 40), so each method is also scored by the target itself: the mean per-token
log-likelihood the target gives to the method's outputs (teacher forcing on prompt + output,
in the benchmark's dtype), over repeat 0. Greedy decoding's own output is the reference; a
lossless method scores exactly what ``ar`` scores, an approximate one at most that much more
(greedy maximises each step, not the sum, so a drift can score higher), usually less.
Identical outputs are scored once.
"""

from __future__ import annotations

from collections import defaultdict

from tqdm import tqdm

from bench.methods import Prompt, Record


def token_log_likelihoods(model, prompt_ids: list[int], tokens: list[int]) -> list[float]:
    """log p(tokens[i] | prompt, tokens[:i]) under ``model`` (an HF causal LM), one pass."""
    import torch

    if not tokens:
        return []
    ids = torch.tensor([prompt_ids + tokens], dtype=torch.long, device=model.device)
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt_ids) - 1: -1].double()
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(1, torch.tensor(tokens, device=logp.device)[:, None])[:, 0]
    return picked.tolist()


def mean_log_likelihood(records: list[Record], prompts: list[Prompt], model,
                        progress: bool = True) -> dict[tuple[str, str], float]:
    """(workload, method) -> the target's mean log-likelihood per generated token, token
    weighted over the workload's repeat-0 outputs."""
    by_id = {p.id: p.ids for p in prompts}
    todo = [r for r in records if r.repeat == 0]
    scored: dict[tuple[str, tuple[int, ...]], list[float]] = {}
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for r in tqdm(todo, desc="target log-likelihood", disable=not progress):
        key = (r.prompt, tuple(r.tokens))
        if key not in scored:
            scored[key] = token_log_likelihoods(model, by_id[r.prompt], r.tokens)
        total = sums[(r.workload, r.method)]
        total[0] += sum(scored[key])
        total[1] += len(r.tokens)
    return {k: s / n for k, (s, n) in sums.items() if n}

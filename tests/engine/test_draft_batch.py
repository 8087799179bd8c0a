"""DraftWorker.draft_batch / commit_batch against one request at a time: over requests with
different context lengths and limits (0 and 1 among them), across several rounds, every drafter
gives each request the same tokens, probs, policy state and random stream (float64 tiny models).

The rounds need no target: each round's result is made from the draft by one seeded generator
(an accepted prefix, a bonus token, random feature rows), so both runs see the same results as
long as their drafts agree."""

from __future__ import annotations

import pytest
import torch

from specdec.engine.loading import load_pair, untrained_preverifier
from specdec.engine.settings import GenerationParams, SpecSettings
from specdec.engine.workers import DraftWorker, OpenRequest, RoundResult
from specdec.models.hybrid import HybridState

# context lengths differ (1 to 15 tokens); limits per round, 0 and 1 included. Bonus tokens are
# drawn from {3, 4, 5}, so the repeating prompt c keeps finding long suffix matches.
PROMPTS = {"a": [5], "b": [7, 8, 9], "c": [3, 4, 5] * 5, "d": list(range(20, 33))}
LIMITS = [{"a": 7, "b": 1, "c": 0, "d": 4}, {"a": 1, "b": 7, "c": 3, "d": 0},
          {"a": 0, "b": 2, "c": 7, "d": 7}, {"a": 5, "b": 0, "c": 1, "d": 6}]


def make_worker(tiny_llama, drafter: str, policy: str) -> DraftWorker:
    """A fresh drafter per run: the suffix drafter's global tree is shared by its requests."""
    pair = load_pair(tiny_llama["target"], tiny_llama.get(drafter, drafter),
                     "untrained" if drafter == "hybrid" else None, dtype="float64",
                     block_drafter=tiny_llama["block-drafter"])
    pre = untrained_preverifier(pair.drafter) if policy == "pacer" else None
    return DraftWorker(pair.drafter, pre)


def width(worker: DraftWorker) -> int:
    """Feature width the drafter reads (0: none)."""
    block = getattr(worker.draft_model, "block", worker.draft_model)
    config = getattr(block, "config", None)
    return len(config.tap_layers) * config.feature_size if hasattr(config, "tap_layers") else 0


def open_all(worker: DraftWorker, spec: SpecSettings, temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    for i, (rid, prompt) in enumerate(PROMPTS.items()):
        features = torch.randn(len(prompt) - 1, width(worker), generator=gen, dtype=torch.float64)
        params = GenerationParams(temperature=temperature, seed=100 + i, spec=spec)
        worker.open({rid: OpenRequest(prompt, params)},
                    {rid: features if width(worker) else None})


def results(drafts: dict, n_features: int, gen: torch.Generator) -> dict:
    """Per request: accept a random prefix of its draft, add a bonus token, random taps."""
    out = {}
    for rid, draft in drafts.items():
        accepted = int(torch.randint(0, len(draft.tokens) + 1, (1,), generator=gen))
        tokens = draft.tokens[:accepted] + [int(torch.randint(3, 6, (1,), generator=gen))]
        feats = torch.randn(len(tokens), n_features, generator=gen, dtype=torch.float64)
        out[rid] = (RoundResult(tokens, accepted, 0.0, 0, feats if n_features else None),
                    len(draft.tokens))
    return out


def run(worker: DraftWorker, batched: bool, inspect=None) -> list[dict]:
    """Every round's drafts, drafting and committing all requests at once or one by one;
    ``inspect(limits)`` runs after each round's drafts, before its commits."""
    gen, rounds = torch.Generator().manual_seed(1), []
    for limits in LIMITS:
        if batched:
            drafts = worker.draft_batch(limits)
        else:
            drafts = {rid: worker.draft(rid, limit) for rid, limit in limits.items()}
        rounds.append(drafts)
        if inspect is not None:
            inspect(limits)
        commits = results(drafts, width(worker), gen)
        if batched:
            worker.commit_batch(commits)
        else:
            for rid, (result, drafted) in commits.items():
                worker.commit(rid, result, drafted)
    return rounds


def assert_same(batched: list[dict], alone: list[dict], sampling: bool) -> None:
    for r, (b_round, a_round) in enumerate(zip(batched, alone, strict=True)):
        for rid, a in a_round.items():
            b = b_round[rid]
            assert b.tokens == a.tokens, (r, rid)
            assert b.source == a.source, (r, rid)
            assert (b.probs is None) == (a.probs is None) == (not sampling or not a.tokens)
            if a.probs is not None:
                torch.testing.assert_close(b.probs, a.probs, rtol=0, atol=1e-10)
    assert any(d.tokens for r in alone for d in r.values())  # they drafted something


def assert_same_request_state(one: DraftWorker, other: DraftWorker) -> None:
    for rid in PROMPTS:
        a, b = one.requests[rid], other.requests[rid]
        assert a.policy_state == b.policy_state, rid
        assert a.sampling.generator.get_state().equal(b.sampling.generator.get_state()), rid


def record_forwards(worker: DraftWorker) -> list[set[str]]:
    """Wrap the block drafter's forward; each call appends the set of request ids it ran for."""
    block = getattr(worker.draft_model, "block", worker.draft_model)
    rids = {}  # the block drafter's state of each request -> its id
    for rid, req in worker.requests.items():
        rids[id(req.state.block if isinstance(req.state, HybridState) else req.state)] = rid
    calls, forward = [], block._forward
    block._forward = lambda states: (calls.append({rids[id(s)] for s in states}), forward(states))[1]
    return calls


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("policy", ["fixed", "heuristic", "pacer"])
def test_block_drafter_batch_equals_one_by_one(tiny_llama, policy, temperature):
    spec = SpecSettings(policy=policy, gamma=3, block_size=2, threshold=0.3, max_draft=7)
    workers = [make_worker(tiny_llama, "block-drafter", policy) for _ in range(2)]
    for worker in workers:
        open_all(worker, spec, temperature)
    calls = record_forwards(workers[0])
    batched, alone = run(workers[0], batched=True), run(workers[1], batched=False)
    assert_same(batched, alone, temperature > 0)
    assert_same_request_state(workers[0], workers[1])
    # one forward per round, for exactly the requests with a positive limit
    assert calls == [{rid for rid, limit in limits.items() if limit > 0} for limits in LIMITS]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hybrid_batches_the_block_pass_of_low_suffix_scores_only(tiny_llama, temperature):
    spec = SpecSettings(gamma=6, max_draft=7, hybrid_skip=1.5, block_size=2, threshold=0.2)
    workers = [make_worker(tiny_llama, "hybrid", "fixed") for _ in range(2)]
    for worker in workers:
        open_all(worker, spec, temperature)
    calls, low = record_forwards(workers[0]), []
    reqs = workers[0].requests

    def suffix_scores_below_skip(limits):  # each request's suffix draft is cached till commit
        low.append({rid for rid, limit in limits.items()
                    if min(limit, spec.gamma) > 0
                    and sum(reqs[rid].state.suffix.draft.probs[:min(limit, spec.gamma)]) < 1.5})

    batched = run(workers[0], batched=True, inspect=suffix_scores_below_skip)
    alone = run(workers[1], batched=False)
    assert_same(batched, alone, temperature > 0)
    assert_same_request_state(workers[0], workers[1])
    sources = {d.source for r in alone for d in r.values()}
    assert {"suffix", "block"} <= sources  # the repeating prompt c drafts from its suffix tree
    # one block forward a round (none when every score is high), for exactly the low scores
    assert calls == [rids for rids in low if rids]
    assert max(len(rids) for rids in calls) > 1


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lookup_drafters_run_through_draft_batch(tiny_llama, drafter, temperature):
    spec = SpecSettings(gamma=5)
    workers = [make_worker(tiny_llama, drafter, "fixed") for _ in range(2)]
    for worker in workers:
        open_all(worker, spec, temperature)
    assert not hasattr(workers[0].draft_model, "prepare")  # nothing to batch: lookups per request
    assert_same(run(workers[0], batched=True), run(workers[1], batched=False), temperature > 0)
    assert_same_request_state(workers[0], workers[1])


def test_a_bad_commit_in_a_batch_changes_no_request(tiny_llama):
    worker = make_worker(tiny_llama, "block-drafter", "fixed")
    open_all(worker, SpecSettings(gamma=3), 0.0)
    drafts = worker.draft_batch({rid: 3 for rid in PROMPTS})
    commits = results(drafts, width(worker), torch.Generator().manual_seed(2))
    bad, drafted = commits["c"]
    commits["c"] = (RoundResult(bad.tokens, bad.accepted, 0.0, 0, bad.features[:-1]), drafted)
    before = {rid: list(req.state.committed) for rid, req in worker.requests.items()}
    with pytest.raises(ValueError, match="target features"):
        worker.commit_batch(commits)
    assert {rid: req.state.committed for rid, req in worker.requests.items()} == before


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_acceptance_model_scores_follow_the_root_batched_or_alone(tiny_llama, drafter):
    """With the acceptance model on, PACER's drafts and their survival are the same batched or
    one by one: bitwise for a sampled request, to float rounding for greedy ones (whose roots
    and windows' scores are computed for all of them in one call: ``DraftWorker._ahead``); each
    request's root is the last row of the taps its commit got; a request that turns it off
    (``acceptance=False``) gets neither survival nor a root."""
    pairs = [load_pair(tiny_llama["target"], drafter, dtype="float64", acceptance_ref="untrained")
             for _ in range(2)]
    workers = [DraftWorker(p.drafter, acceptance=p.acceptance) for p in pairs]
    h = pairs[0].target.hidden_size
    spec = SpecSettings(policy="pacer", block_size=2, threshold=0.3, max_draft=7)
    for worker in workers:
        gen = torch.Generator().manual_seed(0)
        for rid, prompt in PROMPTS.items():
            features = torch.randn(len(prompt) - 1, h, generator=gen, dtype=torch.float64)
            worker.open({rid: OpenRequest(prompt, GenerationParams(spec=spec))}, {rid: features})
        off = GenerationParams(spec=SpecSettings(gamma=3, acceptance=False))
        worker.open({"off": OpenRequest(PROMPTS["c"], off)}, {"off": None})
        sampled = GenerationParams(temperature=1.0, seed=3, spec=spec)
        features = torch.randn(len(PROMPTS["d"]) - 1, h, generator=gen, dtype=torch.float64)
        worker.open({"sampled": OpenRequest(PROMPTS["d"], sampled)}, {"sampled": features})
    limits = [{**limit, "off": 3, "sampled": 5} for limit in LIMITS]
    gens = [torch.Generator().manual_seed(1) for _ in workers]
    for limit in limits:
        batched = workers[0].draft_batch(limit)
        alone = {rid: workers[1].draft(rid, n) for rid, n in limit.items()}
        for rid, d in batched.items():
            assert d.tokens == alone[rid].tokens, rid
            if rid == "sampled" or d.survival is None:
                assert d.survival == alone[rid].survival, rid
            else:
                assert d.survival == pytest.approx(alone[rid].survival, rel=1e-5), rid
            if rid == "off" or not d.tokens:
                assert d.survival is None, rid
                continue
            assert len(d.survival) == len(d.tokens) and 0 < d.survival[-1] <= d.survival[0] < 1
        for worker, gen, drafts in zip(workers, gens, (batched, alone), strict=True):
            commits = {}
            for rid, d in drafts.items():
                tokens = d.tokens[:1] + [4]
                feats = torch.randn(len(tokens), h, generator=gen, dtype=torch.float64)
                commits[rid] = (RoundResult(tokens, len(tokens) - 1, 0.0, 0, feats), len(d.tokens))
            worker.commit_batch(commits)
            for rid, (result, _) in commits.items():
                root = worker.requests[rid].root
                want = None if rid == "off" else worker.acceptance.root(result.features[-1:])
                if want is None or rid == "sampled":
                    assert root is want is None or root.equal(want), rid
                else:
                    assert torch.allclose(root, want, rtol=1e-5, atol=1e-6), rid


def test_a_fixed_window_draft_carries_survival_only_where_it_is_read(tiny_llama):
    """PACER's scores give a draft its survival for free; a fixed window's costs a scoring,
    made only for a caller that reads it (a scheduler that prices drafts)."""
    pair = load_pair(tiny_llama["target"], "ngram", dtype="float64", acceptance_ref="untrained")
    worker = DraftWorker(pair.drafter, acceptance=pair.acceptance)
    params = GenerationParams(spec=SpecSettings(gamma=4))
    for rid in ("a", "b"):
        worker.open({rid: OpenRequest(PROMPTS["c"], params)}, {rid: None})
    unread = worker.draft("a", 4)
    assert unread.tokens and unread.survival is None and unread.preverifier_s == 0
    worker.survival = True
    read = worker.draft("b", 4)
    assert read.tokens == unread.tokens and len(read.survival) == len(read.tokens)


def test_a_whole_drafter_scores_a_steps_windows_in_one_call(tiny_llama):
    """The suffix drafter drafts whole windows: under the acceptance model one draft step scores
    every greedy request's window in one call, whatever PACER's blocks, and one commit step
    computes every root in one call."""
    pair = load_pair(tiny_llama["target"], "suffix", dtype="float64", acceptance_ref="untrained")
    worker = DraftWorker(pair.drafter, acceptance=pair.acceptance)
    spec = SpecSettings(policy="pacer", block_size=1, threshold=0.0, max_draft=6)
    for rid, prompt in PROMPTS.items():
        worker.open({rid: OpenRequest(prompt * 3, GenerationParams(spec=spec))}, {rid: None})
    calls = []
    net = worker.acceptance.net
    score = net.score_projected
    net.score_projected = lambda x: calls.append(tuple(x.shape)) or score(x)
    drafts = worker.draft_batch({rid: 6 for rid in PROMPTS})
    drafted = [rid for rid, d in drafts.items() if d.tokens]
    assert len(drafted) >= 2 and len(calls) == 1 and calls[0][0] == len(drafted), calls
    h = pair.target.hidden_size
    results = {rid: (RoundResult([4], 0, 0.0, 0, torch.ones(1, h, dtype=torch.float64)),
                     len(d.tokens)) for rid, d in drafts.items()}
    roots = worker.acceptance.roots
    seen = []
    worker.acceptance.roots = lambda taps: seen.append(len(taps)) or roots(taps)
    worker.commit_batch(results)
    assert seen == [len(PROMPTS)]

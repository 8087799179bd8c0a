import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.algorithms.verify import make_verifier
from specdec.models.block_drafter import BlockDrafter
from specdec.models.target import TargetModel
from specdec.training.simulation import simulate_request
from tests.conftest import greedy_reference
from tests.device_guard import GuardedCuda


def test_records_are_consistent_with_strict_verification(pair64):
    target, drafter = pair64.target, pair64.drafter
    prompt = list(b"def f(x):\n    return")
    records = simulate_request(target, drafter, make_verifier("strict"), prompt, 24,
                               draft_len=drafter.max_draft_len, pacer_block=3)
    assert records and all(len(r.hidden) == drafter.hidden_size for r in records)
    for r in records:
        assert r.block == r.position // 3 and r.regret >= 0
        if r.accepted:
            assert r.token == r.greedy and r.regret == 0
    # accepted labels form a prefix of each step
    by_step: dict[int, list[int]] = {}
    for r in records:
        by_step.setdefault(r.step, []).append(r.accepted)
    assert all(labels == sorted(labels, reverse=True) for labels in by_step.values())
    # the greedy tokens of accepted positions and the bonuses rebuild greedy decoding
    ref = greedy_reference(target.model, prompt, 8, target.eos_token_ids)
    first = [r for r in records if r.step == 0]
    assert first[0].greedy == ref[0]
    assert torch.is_tensor(torch.tensor([r.regret for r in records]))


def guarded_pair(paths: dict, guard: GuardedCuda):
    """The tiny float64 pair with the target on the stand-in GPU (transformers' forward) and
    the block drafter following it there."""
    model = AutoModelForCausalLM.from_pretrained(paths["target"], dtype=torch.float64)
    taps = BlockDrafter.read_config(paths["block-drafter"])[0].tap_layers
    with guard:
        target = TargetModel(model.to("cuda"), AutoTokenizer.from_pretrained(paths["target"]),
                             taps, backend="transformers")
        return target, BlockDrafter.load(paths["block-drafter"], target)


def test_a_target_on_the_gpu_records_what_the_cpu_does(tiny_llama, pair64):
    """Logits on the GPU, drafts on the CPU: verification and the records cross at one
    boundary, so nothing mixes devices and the records are the CPU's."""
    prompt = list(b"def f(x):\n    return")
    drafter = pair64.drafter
    ref = simulate_request(pair64.target, drafter, make_verifier("strict"), prompt, 12,
                           drafter.max_draft_len, 3)
    guard = GuardedCuda()
    target, drafter = guarded_pair(tiny_llama, guard)
    assert target.device.type == "cuda" and drafter.device.type == "cuda"
    with guard:
        got = simulate_request(target, drafter, make_verifier("strict"), prompt, 12,
                               drafter.max_draft_len, 3)
    assert got == ref


def test_acceptance_records_hold_the_root_state_the_embedding_and_the_signals(tiny_llama):
    """The n-gram drafter with the acceptance model's features: each round's root is the
    target's last-layer state (after the final norm, as HF's last hidden state) at the position
    p whose logits gave the round's pending token (so its draft's greedy tokens are the greedy
    sequence's from p + 2 on); then the drafted token's embedding; then the signals."""
    from specdec.engine.loading import load_pair

    pair = load_pair(tiny_llama["target"], "ngram", dtype="float64", acceptance_ref="untrained")
    target, h = pair.target, pair.target.hidden_size
    prompt, n = list(b"abc abc abc abc ab"), 16
    records = simulate_request(target, pair.drafter, make_verifier("strict"), prompt, n,
                               draft_len=6, acceptance=pair.acceptance)
    assert records and all(len(r.hidden) == 2 * h + pair.drafter.hidden_size for r in records)
    full = prompt + greedy_reference(target.model, prompt, n, target.eos_token_ids)
    with torch.no_grad():
        states = target.model(input_ids=torch.tensor([full]),
                              output_hidden_states=True).hidden_states[-1][0].float()  # [T, H]
    embedding, last = target.embedding_weight(), -1
    for step in sorted({r.step for r in records}):
        mine = [r for r in records if r.step == step]
        root = torch.tensor(mine[0].hidden[:h])
        p = int((states - root).abs().amax(-1).argmin())
        assert p > last and (step > 0 or p == len(prompt) - 2), (step, p)
        torch.testing.assert_close(root, states[p], atol=1e-5, rtol=1e-5)
        for r in mine:
            assert r.hidden[:h] == mine[0].hidden[:h]
            if all(m.accepted for m in mine[:r.position]):  # reached: on the greedy sequence
                assert r.greedy == full[p + 2 + r.position], (step, r.position)
            assert r.hidden[2 * h + 2:] == [r.position / 8, 1.0]  # the n-gram's own signals
            torch.testing.assert_close(torch.tensor(r.hidden[h:2 * h]), embedding[r.token].float())
        last = p


def test_the_acceptance_model_beside_a_target_on_the_gpu_mixes_no_devices(tiny_llama):
    """Taps and embedding on the GPU, the acceptance model on the CPU: the records and the
    engine's tokens are the CPU's (transformers' forward on both)."""
    from specdec.engine.engine import Engine
    from specdec.engine.settings import GenerationParams, SpecSettings
    from specdec.models.acceptance import untrained_acceptance
    from specdec.models.ngram import NgramDrafter

    prompt, drafter = list(b"abc abc abc abc ab"), NgramDrafter(320)
    spec = GenerationParams(12, spec=SpecSettings(policy="pacer", block_size=2, threshold=0.2))

    def run(device: str, guard=None):
        model = AutoModelForCausalLM.from_pretrained(tiny_llama["target"], dtype=torch.float64)
        target = TargetModel(model.to(device), AutoTokenizer.from_pretrained(tiny_llama["target"]),
                             (model.config.num_hidden_layers - 1,), backend="transformers")
        acceptance = untrained_acceptance("ngram", drafter, target.embedding_weight())
        records = simulate_request(target, drafter, make_verifier("strict"), prompt, 12, 6,
                                   acceptance=acceptance)
        out = Engine(target, drafter, acceptance=acceptance).generate(prompt, spec)
        return records, out.token_ids, out.stats.preverifier_s > 0

    want = run("cpu")
    guard = GuardedCuda()
    with guard:
        got = run("cuda")
    assert got == want and want[2]

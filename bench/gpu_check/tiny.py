"""Stage (a) of the GPU check: the tiny random pair (``specdec.models.tiny``, built from configs
at run time: nothing carried) on the device. ``engine``: plain greedy against strict SD, ASD with
budget 0 and a cache-free HF argmax loop, token for token, in float64 (must be exact) and
float32 (recorded); ``actors``: the target and drafter actors without Ray, driven as the
orchestrator drives them; ``train_drafter`` and ``train_preverifier``: a few steps of each
pipeline's loop. Not a speed measurement: the models are far too small to time.
"""

from __future__ import annotations

import math
import time

import torch

from bench.gpu_check import prompts
from bench.gpu_check.report import Context

STEPS = 20  # training steps of each trainer
GAMMA = 4  # the strict and ASD draft window


def plan_of(target) -> dict | None:
    return None if target.plan is None else target.plan.to_dict()  # None: on transformers


def build(ctx: Context) -> dict:
    from specdec.models.tiny import make_tiny_models

    paths = {k: str(v) for k, v in make_tiny_models(ctx.out / "tiny-models").items()}
    ctx.keep["tiny"] = paths
    return paths


def tiny_prompts(target) -> list[list[int]]:
    texts = prompts.BUILTIN["benchmark"][:3]
    return [target.tokenizer(t)["input_ids"][:48] for t in texts]


def hf_greedy(model, prompt_ids: list[int], n: int, eos: frozenset[int]) -> list[int]:
    """Greedy decoding by full forwards, no cache: the independent ground truth."""
    ids, out = list(prompt_ids), []
    device = next(model.parameters()).device
    with torch.no_grad():
        for _ in range(n):
            token = int(model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token in eos:
                break
    return out


def engine(ctx: Context) -> dict:
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_pair
    from specdec.engine.settings import GenerationParams, SpecSettings

    paths, n = ctx.keep["tiny"], ctx.args.tiny_tokens
    methods = {"strict": SpecSettings("fixed", gamma=GAMMA),
               "asd_budget_0": SpecSettings("fixed", verify="asd", gamma=GAMMA, asd_budget=0)}
    out = {}
    for dtype in ("float64", "float32"):
        pair = load_pair(paths["target"], paths["block-drafter"], dtype=dtype,
                         device=ctx.args.device)
        plain, spec = Engine(pair.target), Engine(pair.target, pair.drafter)
        rows = []
        for ids in tiny_prompts(pair.target):
            ref = plain.generate(ids, GenerationParams(max_new_tokens=n)).token_ids
            row = {"prompt_len": len(ids), "plain": ref,
                   "plain_equals_hf": ref == hf_greedy(pair.target.model, ids, n,
                                                       pair.target.eos_token_ids)}
            for name, settings in methods.items():
                got = spec.generate(ids, GenerationParams(max_new_tokens=n, spec=settings))
                row[f"{name}_equal"] = got.token_ids == ref
                row[f"{name}_accepted_length"] = round(got.stats.mean_accepted_length, 3)
            rows.append(row)
        out[dtype] = {"device": str(pair.target.device), "plan": plan_of(pair.target),
                      "outputs": rows,
                      **{f"{k}_all": all(r[k] for r in rows)
                         for k in ("plain_equals_hf", "strict_equal", "asd_budget_0_equal")}}
    ctx.keep["tiny_plain"] = [r["plain"] for r in out["float64"]["outputs"]]
    f64 = out["float64"]
    out["passed"] = f64["strict_equal_all"] and f64["asd_budget_0_equal_all"]
    return out


def actor_tokens(target, prompt_ids: list[int], params, rid: str) -> list[int]:
    """One request served as the replica has it served: the target runs its rounds and calls
    its drafter actor; the tokens of the messages it streams."""
    return [t for message in target.rounds(rid, prompt_ids, params) for t in message.tokens]


def actors(ctx: Context) -> dict:
    from actors.drafter import DrafterActor
    from actors.target import TargetActor
    from specdec.engine.settings import GenerationParams, SpecSettings

    paths, device = ctx.keep["tiny"], ctx.args.device
    drafter = DrafterActor(paths["block-drafter"], paths["target"], dtype="float64",
                           device=device)
    target = TargetActor(paths["target"], paths["block-drafter"], "float64", device=device,
                         drafter=drafter)
    params = GenerationParams(max_new_tokens=ctx.args.tiny_tokens,
                              spec=SpecSettings("fixed", gamma=GAMMA))
    ids = tiny_prompts(target.worker.target_model)
    got = [actor_tokens(target, p, params, f"r{i}") for i, p in enumerate(ids)]
    equal = [g == want for g, want in zip(got, ctx.keep["tiny_plain"], strict=True)]
    freed = target.active() == [] and drafter.active() == []
    return {"device": str(target.worker.target_model.device),
            "plan": plan_of(target.worker.target_model), "requests": len(ids),
            "equal_engine": equal, "state_freed": freed, "passed": all(equal) and freed}


def corpus_file(ctx: Context, target_path: str, rows: list[tuple[list[int], list[int]]],
                name: str):
    """A corpus Parquet (``CORPUS_SCHEMA``) of (prompt ids, response ids) rows, split train."""
    import pyarrow as pa

    from pipelines.common.formats import CORPUS_SCHEMA
    from pipelines.common.tables import write_table

    table = pa.Table.from_pylist(
        [dict(id=f"gpu-check-{i}", source="gpu_check", split="train", prompt_ids=p,
              input_ids=p + r, prompt_len=len(p)) for i, (p, r) in enumerate(rows)],
        schema=CORPUS_SCHEMA)
    return str(write_table(table, ctx.out / name, {"specdec.target": target_path}))


def train_drafter(ctx: Context) -> dict:
    from pipelines.train_drafter import TrainDrafterConfig, one_step, setup
    from specdec.models.target import TargetModel

    paths = ctx.keep["tiny"]
    tokenizer = TargetModel.from_pretrained(paths["target"], "float32").tokenizer
    texts = prompts.BUILTIN["benchmark"] + prompts.BUILTIN["train"]
    rows = [(ids[:8], ids[8:64]) for ids in (tokenizer(t)["input_ids"] for t in texts)]
    cfg = TrainDrafterConfig.model_validate({
        "target": paths["target"], "corpus": corpus_file(ctx, paths["target"], rows,
                                                         "tiny-corpus.parquet"),
        "run_dir": str(ctx.out / "tiny-train-drafter"), "steps": STEPS, "batch_size": 2,
        "anchors_per_sequence": 4, "max_seq_len": 64, "eval_every": STEPS,
        "drafter": {"block_size": 4, "num_layers": 1, "num_taps": 2},
        "scaling": {"torch_threads": torch.get_num_threads()}})
    loop = setup(cfg, None, None, 0, 1, torch.device(ctx.args.device))
    start, losses = time.monotonic(), []
    for step in range(STEPS):
        losses.append(one_step(loop, step, STEPS)["loss"])
    seconds = time.monotonic() - start
    return {"device": str(next(loop.drafter.net.parameters()).device), "steps": STEPS,
            "first_loss": losses[0], "last_loss": losses[-1], "ms_per_step":
            round(1000 * seconds / STEPS, 1), "passed": all(math.isfinite(x) for x in losses)}


def train_preverifier(ctx: Context) -> dict:
    from pipelines.train_preverifier import evaluate, pick, train_step
    from specdec.algorithms.verify import make_verifier
    from specdec.engine.loading import load_pair
    from specdec.models.preverifier import PreVerifier, PreVerifierConfig
    from specdec.training.preverifier_data import Step, pack_steps
    from specdec.training.simulation import simulate_request

    paths, device = ctx.keep["tiny"], torch.device(ctx.args.device)
    pair = load_pair(paths["target"], paths["block-drafter"], dtype="float32", device=device)
    records = []
    for i, ids in enumerate(tiny_prompts(pair.target)):
        for r in simulate_request(pair.target, pair.drafter, make_verifier("strict"), ids,
                                  ctx.args.tiny_tokens, pair.drafter.max_draft_len):
            records.append(((i, r.step), r))
    steps = []
    for key in dict.fromkeys(k for k, _ in records):
        mine = [r for k, r in records if k == key]
        steps.append(Step(torch.tensor([r.hidden for r in mine]),
                          torch.tensor([float(r.accepted) for r in mine])))
    packed = pack_steps(steps, pack_len=16).to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = PreVerifier(PreVerifierConfig(input_size=packed.hidden.shape[-1], width=16,
                                            heads=2, max_positions=8)).to(device).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    draws = [[(0, int(i)) for i in torch.randint(packed.hidden.shape[0], (4,), generator=gen)]
             for _ in range(STEPS)]  # one worker, one shard: every slot of the batch
    losses = [train_step(net, opt, pick({0: packed}, d), world=1) for d in draws]
    metrics = evaluate(net, packed)
    return {"device": str(next(net.parameters()).device), "drafted_tokens": len(records),
            "steps": STEPS, "first_loss": losses[0], "last_loss": losses[-1],
            "heldout": metrics,
            "passed": all(math.isfinite(x) for x in losses) and math.isfinite(metrics["loss"])}

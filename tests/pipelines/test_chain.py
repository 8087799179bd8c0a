"""The whole chain on the tiny pair, through Ray: corpus -> responses -> train_drafter ->
simulate -> train_preverifier -> evaluate; then the registered champion drafter is loaded from
the MLflow registry into the engine and must reproduce the target's greedy output exactly. The suffix
drafter's chain too: responses -> suffix_index -> simulate (acceptance features) ->
train_preverifier (an acceptance model) -> evaluate_acceptance, and the registry -> the engine,
lossless."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from pipelines import (
    corpus,
    evaluate,
    evaluate_acceptance,
    responses,
    simulate,
    suffix_index,
    train_drafter,
    train_preverifier,
)
from pipelines.common.steps import steps_of
from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair
from specdec.engine.settings import GenerationParams
from specdec.models.registry import resolve_model_ref
from tests.pipelines.conftest import config

ACTORS = {"size": 1, "num_cpus": 1, "torch_threads": 1}


@pytest.fixture(scope="module")
def chain(ray_session, store, tiny_llama):
    root, target = store["root"], tiny_llama["target"]
    out = {"target": target}
    out["corpus"] = corpus.run(config(
        corpus.CorpusConfig, store, target=target, out_dir=str(root / "corpus"),
        max_conversations=40, max_tokens=160, max_prompt_tokens=440, humaneval_limit=6,
        benchmark_percent=10, dev_percent=10))
    out["responses"] = responses.run(config(
        responses.ResponsesConfig, store, target=target, corpus=str(out["corpus"]["train"]),
        out=str(root / "responses" / "train.parquet"), max_new_tokens=24, limit=12,
        actors=ACTORS | {"batch_size": 4}))
    out["suffix_index"] = suffix_index.run(config(
        suffix_index.SuffixIndexConfig, store, target=target, responses=out["responses"]["path"],
        out=str(root / "suffix_index"), mlflow={"champion": True}))
    out["drafter"] = train_drafter.run(config(
        train_drafter.TrainDrafterConfig, store, target=target, anchors="response",
        corpus=out["responses"]["path"], labels="text", run_dir=str(root / "drafter"),
        drafter={"block_size": 6, "num_taps": 2}, steps=6, batch_size=2,
        anchors_per_sequence=6, max_seq_len=96, checkpoint_every=3, lr=3e-3,
        scaling={"num_workers": 0, "torch_threads": 1}, mlflow={"champion": True}))
    out["steps"] = simulate.run(config(
        simulate.SimulateConfig, store, target=target, dtype="float64",
        drafter="models:/target-block-drafter@champion", prompts=str(out["corpus"]["train"]),
        limit=3, max_new_tokens=16, actors=ACTORS, out=str(root / "sim" / "steps.parquet")))
    out["preverifier"] = train_preverifier.run(config(
        train_preverifier.TrainPreVerifierConfig, store, target=target, data=str(out["steps"]),
        run_dir=str(root / "preverifier"), steps=10, pack_len=10, heldout_percent=30,
        model={"width": 16, "heads": 2, "max_positions": 8},
        scaling={"num_workers": 0, "torch_threads": 1}, mlflow={"champion": True}))
    out["suffix_steps"] = simulate.run(config(
        simulate.SimulateConfig, store, target=target, dtype="float64", drafter="suffix",
        suffix_index="models:/target-suffix-index@champion", prompts=str(out["corpus"]["train"]),
        limit=3, max_new_tokens=16, draft_len=6, actors=ACTORS,
        out=str(root / "sim-suffix" / "steps.parquet")))
    out["acceptance"] = train_preverifier.run(config(
        train_preverifier.TrainPreVerifierConfig, store, target=target,
        data=str(out["suffix_steps"]), run_dir=str(root / "acceptance"), steps=10, pack_len=8,
        heldout_percent=30, checkpoint_every=5, select="best",
        model={"width": 16, "heads": 2, "max_positions": 8},
        save_dtype="bfloat16", scaling={"num_workers": 0, "torch_threads": 1},
        mlflow={"champion": True}))
    out["acceptance_eval"] = evaluate_acceptance.run(config(
        evaluate_acceptance.EvaluateAcceptanceConfig, store, data=str(out["suffix_steps"]),
        model="models:/target-acceptance-suffix@champion", prompts=str(out["corpus"]["train"]),
        max_position=4, out_dir=str(root / "acceptance-eval")))
    out["evaluate"] = evaluate.run(config(
        evaluate.EvaluateConfig, store, target=target, dtype="float64",
        drafter="models:/target-block-drafter@champion",
        preverifier="models:/target-preverifier@champion",
        prompts=str(out["corpus"]["benchmark"]), limit=2, max_new_tokens=12, fixed_gammas=[3],
        pacer={"max_draft": 5},
        sweep={"prompts": str(out["corpus"]["dev"]), "limit": 1, "block_sizes": [2],
               "thresholds": [0.5], "growths": [1.0, 1.2], "asd_budget": 1.0,
               "asd_gates": [0.25, 0.5], "asd_max_exceptions": [2]},
        actors=ACTORS))
    return out


def test_corpus_splits_keep_benchmark_out_of_training(chain):
    tables = {s: pq.read_table(p) for s, p in chain["corpus"].items()}
    assert tables["train"].num_rows > 0 and tables["benchmark"].num_rows > 0
    train_ids = set(tables["train"].column("id").to_pylist())
    assert not train_ids & set(tables["benchmark"].column("id").to_pylist())
    assert not train_ids & set(tables["dev"].column("id").to_pylist())
    assert "humaneval" not in set(tables["train"].column("source").to_pylist())


def test_simulation_rows_and_preverifier_metrics(chain):
    steps = pq.read_table(chain["steps"])
    assert steps.num_rows > 0 and set(steps.column("accepted").to_pylist()) <= {0, 1}
    metrics = chain["preverifier"]["metrics"]
    assert {"heldout_loss", "heldout_accuracy", "heldout_auc", "heldout_ece"} <= set(metrics)


def test_evaluation_reports_acceptance_and_picks_pacer_defaults(chain):
    out = chain["evaluate"]
    picked = out["pacer_defaults"]
    assert picked["policy"] == "pacer" and "verify" not in picked  # strict unless asked
    assert picked["asd_gate"] in (0.25, 0.5) and picked["asd_max_exceptions"] == 2
    assert len(out["asd_sweep"]) == 2
    for agg in out["asd_sweep"].values():  # the ledger never spends more than B = 1
        assert 0.0 <= agg["regret_per_request"] <= 1.0 + 1e-9
    for agg in out["benchmark"].values():
        assert agg["mean_accepted_length"] >= 1.0
        assert all(0.0 <= a <= 1.0 for a in agg["acceptance_at"])


def test_champion_from_the_registry_is_lossless_in_the_engine(chain, store):
    drafter_dir = resolve_model_ref("models:/target-block-drafter@champion",
                                    store["tracking_uri"], store["root"] / "dl")
    pre_dir = resolve_model_ref("models:/target-preverifier@champion",
                                store["tracking_uri"], store["root"] / "dl")
    pair = load_pair(chain["target"], drafter_dir, pre_dir, dtype="float64")
    plain = Engine(pair.target)
    spec = Engine(pair.target, pair.drafter, pair.preverifier)
    prompt = list(b"def fib(n):\n    ")
    params = GenerationParams(max_new_tokens=24)
    pacer = GenerationParams(max_new_tokens=24, spec=dict_spec())
    want = plain.generate(prompt, params).token_ids
    assert spec.generate(prompt, params).token_ids == want
    assert spec.generate(prompt, pacer).token_ids == want
    assert torch.is_tensor(pair.drafter.net.mask_embedding)


def dict_spec():
    from specdec.engine.settings import SpecSettings

    return SpecSettings(policy="pacer", block_size=2, threshold=0.3, max_draft=5)


def test_suffix_index_through_the_registry_is_the_responses_and_lossless(chain, store):
    from specdec.models.suffix import SuffixConfig
    from specdec.models.suffix_index import SuffixIndex

    table = pq.read_table(chain["responses"]["path"]).to_pylist()
    want = tuple(tuple(r["input_ids"][r["prompt_len"]:]) for r in table)
    ref = "models:/target-suffix-index@champion"
    assert chain["suffix_index"]["model_uri"].startswith("models:/target-suffix-index/")
    assert chain["suffix_index"]["tree_mb_per_million_tokens"] >= 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", store["tracking_uri"])
        index = SuffixIndex.load(ref)
        assert index.sequences == tuple(s for s in want if len(s) >= 2)
        pair = load_pair(chain["target"], "suffix", dtype="float64", suffix=SuffixConfig(index=ref))
    assert pair.drafter.cached_responses == len(index.sequences)
    prompt = table[0]["prompt_ids"]
    plain = Engine(load_pair(chain["target"], "none", dtype="float64").target)
    expected = plain.generate(prompt, GenerationParams(16)).token_ids
    out = Engine(pair.target, pair.drafter).generate(prompt, GenerationParams(16))
    assert out.token_ids == expected
    assert out.stats.accepted > 0  # its own training response is in the index


def test_the_suffix_drafters_acceptance_model_is_trained_registered_and_lossless(chain, store):
    """Rows of the suffix drafter's rounds hold [root H, embedding H, its 4 signals]; the model
    trained on them registers as target-acceptance-suffix, loads from the registry beside the
    running target and keeps strict greedy SD plain greedy."""
    import mlflow

    from specdec.models.acceptance import AcceptanceModel
    from specdec.models.suffix import SuffixConfig

    steps = pq.read_table(chain["suffix_steps"])
    h = load_pair(chain["target"], "none", dtype="float64").target.hidden_size
    widths = {len(x) for x in steps.column("hidden").to_pylist()}
    assert steps.num_rows > 0 and widths == {2 * h + 4}
    out = chain["acceptance"]
    assert out["model_uri"].startswith("models:/target-acceptance-suffix/")
    assert {"heldout_loss", "heldout_auc", "heldout_ece"} <= set(out["metrics"])
    client = mlflow.MlflowClient(store["tracking_uri"])  # select best: the checkpoint at 5, or 10
    history = client.get_metric_history(out["run_id"], "checkpoint_heldout_loss")
    assert sorted(m.step for m in history) == [5, 10]
    assert client.get_run(out["run_id"]).data.metrics["selected_step"] in (5, 10)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", store["tracking_uri"])
        ref = resolve_model_ref("models:/target-acceptance-suffix@champion")
        pair = load_pair(chain["target"], "suffix", dtype="float64", acceptance_ref=ref,
                         suffix=SuffixConfig(index="models:/target-suffix-index@champion"))
    assert AcceptanceModel.is_checkpoint(ref) and pair.acceptance.config.drafter == "suffix"
    prompt = pq.read_table(chain["responses"]["path"]).to_pylist()[0]["prompt_ids"]
    want = Engine(pair.target).generate(prompt, GenerationParams(16)).token_ids
    engine = Engine(pair.target, pair.drafter, acceptance=pair.acceptance)
    out = engine.generate(prompt, GenerationParams(16, spec=dict_spec()))
    assert out.token_ids == want and out.stats.preverifier_s > 0


def test_the_acceptance_model_is_evaluated_per_position_against_the_path_probability(chain):
    report = chain["acceptance_eval"]
    assert report["drafter"] == "suffix" and report["signal"] == "path probability"
    assert set(report["groups"]) == {"all", "sharegpt"}  # the tiny corpus's training prompts
    first = report["groups"]["all"]["positions"][0]
    assert first["accepted"]["tokens"] == first["survives"]["tokens"] > 0  # all reached there
    for kind in ("reliability", "auc"):
        assert (Path(report["out_dir"]) / f"{kind}-all.png").stat().st_size > 0


def test_the_jobs_log_their_targets_plan(chain, store):
    """Every job that runs the target logs its resolved plan as MLflow params (``plan.*``)."""
    import mlflow

    runs = mlflow.MlflowClient(store["tracking_uri"]).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(store["tracking_uri"]).search_experiments()])
    by_job = {}
    for run in runs:
        by_job.setdefault(run.data.tags.get("mlflow.runName", ""), run.data.params)
    planned = {job: params for job, params in by_job.items() if "plan.backend" in params}
    assert {"responses", "train_drafter", "simulate", "evaluate"} <= {
        job.split("-")[0] for job in planned}, sorted(by_job)
    for params in planned.values():
        assert params["plan.device"] == "cpu" and int(params["plan.memory.kv_pool"]) > 0
        assert params["plan.max_model_len"].isdigit() and params["plan.numerics"]


def test_acceptance_steps_end_at_their_first_rejection():
    """An acceptance model's label is 'accepted given its predecessors were': a step keeps its
    accepted tokens and its first rejection, never the tokens after it."""
    import pyarrow as pa

    from pipelines.common.formats import STEPS_SCHEMA

    labels = {0: [1, 1, 0, 0, 1], 1: [0, 1], 2: [1, 1]}
    rows = [{"request": "r", "step": s, "position": i, "block": 0, "token": 1, "greedy": 1,
             "regret": 0.0, "accepted": a, "hidden": [float(10 * s + i)]}
            for s, step in labels.items() for i, a in enumerate(step)]
    table = pa.Table.from_pylist(rows, schema=STEPS_SCHEMA)
    steps = steps_of(table, reached=True)
    assert [s.labels.tolist() for s in steps] == [[1, 1, 0], [0], [1, 1]]
    assert steps[0].hidden[:, 0].tolist() == [0, 1, 2]
    assert [len(s.labels) for s in steps_of(table)] == [5, 2, 2]

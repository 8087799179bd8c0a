"""Job: how well an acceptance model tells which draft tokens the target accepts, against the
drafter's own signal, position by position (ROC AUC and calibration error), with reliability
diagrams.

Rows: ``pipelines.simulate``'s with acceptance features, of prompts held out of training (the
corpus's ``benchmark`` split: HumanEval and a ShareGPT slice). A round's rows are its draft in
order. Two questions are asked at each draft position i (0-based):

- *accepted*: of the tokens whose predecessors were all accepted, which are accepted too? The
  model's score (what PACER's rule reads) against the signal's ratio s_i / s_{i-1}.
- *survives*: of all the tokens drafted at i, which are accepted along with every token before
  them? The product of the model's scores up to i against s_i (what ``actors.goodput`` prices a
  row by: the model's survival where a request has it on, else s_i).

s_i is ``Goodput.values`` of the draft: the drafter's confidence (the suffix tree's path
probability, ``SIGNAL_COLUMN``) scaled by the accepted tokens per unit of confidence over all the
rows, capped at 1 and non-increasing along the draft. That is goodput's calibration at its fixed
point on the very rows scored: the best single scale, which can only flatter the signal. A
drafter without a confidence (n-gram) is priced by the acceptance rate at each depth, one value
per position (AUC 0.5 at each).

Results per position, and pooled over positions 2 and beyond (i >= 1), for all rows and per
prompt source (with ``prompts``): ``report.json`` and PNGs in ``out_dir``, logged to MLflow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch
from pydantic import Field

from pipelines.common.config import MlflowSettings, Strict, cli_config, default_output
from pipelines.common.formats import CORPUS_SCHEMA, STEPS_SCHEMA
from pipelines.common.tables import read_table

SIGNAL_COLUMN = {"suffix": 0}  # the drafter's confidence among its signals, by drafter kind
QUESTIONS = ("accepted", "survives")


class EvaluateAcceptanceConfig(Strict):
    data: str  # steps.parquet of pipelines.simulate with acceptance features, held-out prompts
    model: str  # the acceptance model: a directory or models:/NAME@ALIAS
    prompts: str | None = None  # the corpus file of the rows' prompts: results per source too
    max_position: int = Field(16, ge=1)  # positions reported one by one (0 .. max_position - 1)
    bins: int = Field(10, ge=2)  # of the calibration error and the reliability diagrams
    out_dir: str | None = None  # default $SPECDEC_HOME/pipelines/evaluate_acceptance
    mlflow: MlflowSettings = MlflowSettings()

    def output(self) -> Path:
        return Path(self.out_dir) if self.out_dir else default_output("evaluate_acceptance")


@dataclass(frozen=True)
class Predictions:
    """Flat over every drafted token: its position, labels and both predictors' probabilities
    for each question (``QUESTIONS``); ``reached``: its predecessors were all accepted."""

    position: torch.Tensor  # [n] long
    reached: torch.Tensor  # [n] bool
    labels: dict[str, torch.Tensor]  # question -> [n] float
    model: dict[str, torch.Tensor]
    signal: dict[str, torch.Tensor]

    def asked(self, question: str) -> torch.Tensor:
        """The tokens ``question`` is asked of: reached ones for *accepted*, all for *survives*."""
        return self.reached if question == "accepted" else torch.ones_like(self.reached)


def model_scores(net, steps: list, chunk: int = 256) -> list[torch.Tensor]:
    """The net's acceptance probability for every token of each step (a list like ``steps``)."""
    from specdec.training.preverifier_data import pack_steps

    longest = max(int(s.labels.shape[0]) for s in steps)
    packed = pack_steps(steps, longest)
    out = []
    with torch.no_grad():
        for lo in range(0, packed.hidden.shape[0], chunk):
            sl = slice(lo, lo + chunk)
            logits = net(packed.hidden[sl], packed.positions[sl], packed.step_ids[sl])
            out.append(torch.sigmoid(logits.float())[packed.valid[sl]])
    return list(torch.cat(out).split([int(s.labels.shape[0]) for s in steps]))


def signal_values(steps: list, column: int | None, signals_at: int) -> list[torch.Tensor]:
    """Each step's s_i (module docstring): ``Goodput.values`` after it has seen every step."""
    from actors.goodput import Goodput, StepCost

    goodput = Goodput(StepCost((1, 2), (1.0, 1.0)))  # the cost is not read here
    confidence = [None if column is None else s.hidden[:, signals_at + column].tolist()
                  for s in steps]
    for step, conf in zip(steps, confidence, strict=True):
        goodput.round(conf, len(step.labels), accepted_prefix(step.labels))
    return [torch.tensor(goodput.values(len(s.labels), conf))
            for s, conf in zip(steps, confidence, strict=True)]


def accepted_prefix(labels: torch.Tensor) -> int:
    return int(torch.cumprod(labels, 0).sum())


def predictions(steps: list, model: list[torch.Tensor], signal: list[torch.Tensor]) -> Predictions:
    pos, reached, labels = [], [], {q: [] for q in QUESTIONS}
    preds = {"model": {q: [] for q in QUESTIONS}, "signal": {q: [] for q in QUESTIONS}}
    for step, m, s in zip(steps, model, signal, strict=True):
        y = step.labels.float()
        survived = torch.cumprod(y, 0)
        pos.append(torch.arange(len(y)))
        reached.append(torch.cat([torch.ones(1), survived[:-1]]) > 0.5)
        labels["accepted"].append(y)
        labels["survives"].append(survived)
        s_before = torch.cat([torch.ones(1), s[:-1].float()])
        preds["model"]["accepted"].append(m)
        preds["model"]["survives"].append(torch.cumprod(m.double(), 0).float())
        preds["signal"]["accepted"].append(torch.where(s_before > 0, s / s_before.clamp_min(1e-12),
                                                       torch.zeros(())).float())
        preds["signal"]["survives"].append(s.float())
    cat = {who: {q: torch.cat(v) for q, v in d.items()} for who, d in preds.items()}
    return Predictions(torch.cat(pos), torch.cat(reached),
                       {q: torch.cat(v) for q, v in labels.items()}, cat["model"], cat["signal"])


def scores_of(p: Predictions, mask: torch.Tensor, bins: int) -> dict:
    """Both predictors' AUC and ECE on both questions over the tokens in ``mask``."""
    from specdec.training.calibration import auc, ece

    out = {}
    for q in QUESTIONS:
        keep = mask & p.asked(q)
        y = p.labels[q][keep]
        row = {"tokens": int(keep.sum()), "rate": float(y.mean()) if len(y) else float("nan")}
        for who, preds in (("model", p.model), ("signal", p.signal)):
            row[f"{who}_auc"] = auc(preds[q][keep], y)
            row[f"{who}_ece"] = ece(preds[q][keep], y, bins) if len(y) else float("nan")
        out[q] = row
    return out


def evaluate(p: Predictions, max_position: int, bins: int) -> dict:
    """Per position (0 .. max_position - 1) and pooled over positions 2 and beyond."""
    per = [scores_of(p, p.position == i, bins) for i in range(max_position)
           if bool((p.position == i).any())]
    return {"positions": per, "from_position_2": scores_of(p, p.position >= 1, bins),
            "all": scores_of(p, torch.ones_like(p.reached), bins)}


def reliability_figure(p: Predictions, bins: int, title: str):
    from pipelines.common.plots import plt
    from specdec.training.calibration import calibration_bins

    fig, axes = plt.subplots(1, 2, figsize=(8, 4))
    for ax, q in zip(axes, QUESTIONS, strict=True):
        keep = p.asked(q)
        ax.plot([0, 1], [0, 1], "--", color="grey")
        for who, preds in (("acceptance model", p.model), ("drafter's signal", p.signal)):
            mean, rate, count = calibration_bins(preds[q][keep], p.labels[q][keep], bins)
            ok = count > 0
            ax.plot(mean[ok].tolist(), rate[ok].tolist(), "o-", label=who)
        ax.set(xlabel="predicted", ylabel="observed", title=f"{q} ({title})", xlim=(0, 1),
               ylim=(0, 1))
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def auc_figure(report: dict, title: str):
    from pipelines.common.plots import plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    rows = report["positions"]
    for ax, q in zip(axes, QUESTIONS, strict=True):
        x = list(range(1, len(rows) + 1))
        for who in ("model", "signal"):
            ax.plot(x, [r[q][f"{who}_auc"] for r in rows], "o-", label=who)
        ax.set(xlabel="draft position (1-based)", ylabel="AUC", title=f"{q} ({title})",
               ylim=(0.4, 1))
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def sources_of(prompts: str | None) -> dict[str, str]:
    if prompts is None:
        return {}
    table = read_table(prompts, CORPUS_SCHEMA, "evaluate_acceptance.prompts")
    return dict(zip(table.column("id").to_pylist(), table.column("source").to_pylist(),
                    strict=True))


def run(cfg: EvaluateAcceptanceConfig) -> dict:
    import mlflow

    from pipelines.common.steps import acceptance_of, steps_of
    from pipelines.common.tracking import log_params, start_run
    from specdec.models.acceptance import AcceptanceConfig, AcceptanceModel
    from specdec.models.preverifier import PreVerifier
    from specdec.models.registry import resolve_model_ref

    meta = acceptance_of(cfg.data, "evaluate_acceptance.data")
    if meta is None:
        raise ValueError(f"evaluate_acceptance.data: {cfg.data} holds no acceptance features "
                         "(pipelines.simulate with acceptance)")
    table = read_table(cfg.data, STEPS_SCHEMA, "evaluate_acceptance.data")
    model_dir = resolve_model_ref(cfg.model, cfg.mlflow.tracking_uri)
    kind = (AcceptanceConfig.read(model_dir).drafter
            if AcceptanceModel.is_checkpoint(model_dir) else None)
    if kind != meta["drafter"]:
        raise ValueError(f"evaluate_acceptance.model: {cfg.model} is no acceptance model of the "
                         f"{meta['drafter']} drafter whose rows {cfg.data} holds")
    net = PreVerifier.load(model_dir).float().eval()
    column, at = SIGNAL_COLUMN.get(meta["drafter"]), 2 * meta["root_size"]
    sources = sources_of(cfg.prompts)
    groups = {"all": table}
    for source in sorted(set(sources.values())):
        mine = [sources.get(r) == source for r in table.column("request").to_pylist()]
        if any(mine):
            groups[source] = table.filter(pa.array(mine))
    out_dir = cfg.output()
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"data": cfg.data, "model": cfg.model, "drafter": meta["drafter"],
              "signal": "path probability" if column is not None else "depth rate",
              "out_dir": str(out_dir), "groups": {}}
    with start_run(cfg.mlflow, "evaluate_acceptance"):
        log_params(cfg.model_dump())
        for name, rows in groups.items():
            steps = steps_of(rows)
            p = predictions(steps, model_scores(net, steps), signal_values(steps, column, at))
            report["groups"][name] = {"requests": len(set(rows.column("request").to_pylist())),
                                      "drafts": len(steps),
                                      **evaluate(p, cfg.max_position, cfg.bins)}
            for fig, kind in ((reliability_figure(p, cfg.bins, name), "reliability"),
                              (auc_figure(report["groups"][name], name), "auc")):
                fig.savefig(out_dir / f"{kind}-{name}.png", dpi=110)
            pooled = report["groups"][name]["from_position_2"]
            mlflow.log_metrics({f"{name}.{q}.{k}": v for q, row in pooled.items()
                                for k, v in row.items() if v == v})
        (out_dir / "report.json").write_text(json.dumps(report, indent=1))
        mlflow.log_artifacts(str(out_dir), artifact_path="evaluate_acceptance")
    return report


def table_text(report: dict) -> str:
    """The pooled and per-position AUCs as Markdown (the job's printout)."""
    lines = ["| group | question | positions | tokens | rate | model AUC | signal AUC | "
             "model ECE | signal ECE |", "|---" * 9 + "|"]
    for name, g in report["groups"].items():
        rows = [("2+", g["from_position_2"])] + [(str(i + 1), r)
                                                 for i, r in enumerate(g["positions"])]
        for label, r in rows:
            for q in QUESTIONS:
                x = r[q]
                lines.append(f"| {name} | {q} | {label} | {x['tokens']} | {x['rate']:.3f} | "
                             f"{x['model_auc']:.3f} | {x['signal_auc']:.3f} | "
                             f"{x['model_ece']:.3f} | {x['signal_ece']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    cfg = cli_config(EvaluateAcceptanceConfig, argv, "Evaluate an acceptance model per position.")
    report = run(cfg)
    print(table_text(report))
    print(f"report: {cfg.output() / 'report.json'}")


if __name__ == "__main__":
    main()

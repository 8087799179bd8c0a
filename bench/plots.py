"""The engine benchmark's PNG figures (matplotlib, Agg), drawn from the summary of one run.

``summary``: workload -> method -> metrics (``bench.metrics.summarise``).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MAIN = ("ngram", "fixed_4", "heuristic", "pacer", "pacer_no_position", "pacer_rho_ablation",
        "dflash_fixed")


def _axes(n: int, width: float = 5.0):
    fig, axes = plt.subplots(1, n, figsize=(width * n, 3.8), squeeze=False)
    return fig, list(axes[0])


def speedup_figure(summary: dict):
    """tokens/s over ar's, one bar per method, a group per workload."""
    workloads = list(summary)
    methods = list(dict.fromkeys(m for w in workloads for m in summary[w]))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(methods) + 2), 4))
    width = 0.8 / max(len(workloads), 1)
    for i, w in enumerate(workloads):
        ratios = [summary[w].get(m, {}).get("ratio_to_ar") or 0.0 for m in methods]
        ax.bar([j + i * width for j in range(len(methods))], ratios, width, label=w)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks([j + width * (len(workloads) - 1) / 2 for j in range(len(methods))])
    ax.set_xticklabels(methods, rotation=45, ha="right")
    ax.set(ylabel="tokens/s vs ar", title="Speedup over our AR (median over repeats)")
    ax.legend()
    fig.tight_layout()
    return fig


def acceptance_figure(summary: dict):
    """Acceptance rate at each draft position for the main speculative methods."""
    fig, axes = _axes(len(summary))
    for ax, (w, per_method) in zip(axes, summary.items(), strict=True):
        for m in MAIN:
            rates = per_method.get(m, {}).get("acceptance_at")
            if rates:
                ax.plot(range(len(rates)), rates, "o-", label=m)
        ax.set(xlabel="position in draft", ylabel="acceptance rate", ylim=(0, 1.05), title=w)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def draft_length_figure(summary: dict):
    """Share of rounds by draft length: PACER vs the heuristic schedule."""
    fig, axes = _axes(len(summary))
    for ax, (w, per_method) in zip(axes, summary.items(), strict=True):
        for i, m in enumerate(("heuristic", "pacer")):
            hist = per_method.get(m, {}).get("draft_lengths") or {}
            total = sum(hist.values()) or 1
            keys = sorted(hist)
            ax.bar([k + (i - 0.5) * 0.4 for k in keys], [hist[k] / total for k in keys], 0.4,
                   label=m)
        ax.set(xlabel="draft length", ylabel="share of rounds", title=w)
        ax.legend()
    fig.tight_layout()
    return fig


def asd_frontier_figure(summary: dict, asd_methods: list[str]):
    """tokens/s against quality for PACER strict and each ASD budget: HumanEval pass@1, and
    per workload the share of outputs equal to AR's."""
    fig, axes = _axes(1 + len(summary))
    points = ["ar", "pacer", *asd_methods]
    he = summary.get("humaneval", {})
    for m in points:
        if he.get(m, {}).get("pass_at_1") is not None:
            axes[0].plot(he[m]["tokens_per_s"], he[m]["pass_at_1"], "o")
            axes[0].annotate(m, (he[m]["tokens_per_s"], he[m]["pass_at_1"]), fontsize=7)
    axes[0].set(xlabel="tokens/s", ylabel="pass@1", title="HumanEval: speed vs pass@1")
    for ax, (w, per_method) in zip(axes[1:], summary.items(), strict=True):
        for m in points:
            if m in per_method:
                x, y = per_method[m]["tokens_per_s"], per_method[m]["same_as_ar"]
                ax.plot(x, y, "o")
                ax.annotate(m, (x, y), fontsize=7)
        ax.set(xlabel="tokens/s", ylabel="share of outputs equal to AR", ylim=(-0.05, 1.05),
               title=f"{w}: speed vs fidelity")
    fig.tight_layout()
    return fig


def figures(summary: dict, asd_methods: list[str]) -> dict:
    """file stem -> figure."""
    return {"speedup": speedup_figure(summary), "acceptance_per_position": acceptance_figure(summary),
            "draft_lengths": draft_length_figure(summary),
            "asd_frontier": asd_frontier_figure(summary, asd_methods)}

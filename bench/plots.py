"""The engine benchmark's PNG figures (matplotlib, Agg), drawn from the summary of one run.

``summary``: workload -> method -> metrics (``bench.metrics.summarise``).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MAIN = ("ngram", "fixed_4", "heuristic", "pacer", "pacer_no_position", "pacer_rho_ablation",
        "dflash_fixed", "suffix_cold", "suffix_warm", "hybrid_pacer")


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


def _scatter(ax, per_method: dict, points: list[str], key: str) -> None:
    for m in points:
        y = per_method.get(m, {}).get(key)
        if y is not None:
            x = per_method[m]["tokens_per_s"]
            ax.plot(x, y, "o")
            ax.annotate(m, (x, y), fontsize=7)


def asd_frontier_figure(summary: dict, asd_methods: dict[str, str]):
    """tokens/s against quality for each ASD budget and the strict method it approximates:
    HumanEval pass@1, and per workload the share of outputs equal to AR's and the target's
    mean log-likelihood per token of the outputs."""
    points = list(dict.fromkeys(["ar", *asd_methods.values(), *asd_methods]))
    fig, axes = _axes(1 + 2 * len(summary), width=4.2)
    _scatter(axes[0], summary.get("humaneval", {}), points, "pass_at_1")
    axes[0].set(xlabel="tokens/s", ylabel="pass@1", title="HumanEval: speed vs pass@1")
    for i, (w, per_method) in enumerate(summary.items()):
        same, likely = axes[1 + 2 * i], axes[2 + 2 * i]
        _scatter(same, per_method, points, "same_as_ar")
        same.set(xlabel="tokens/s", ylabel="share of outputs equal to AR", ylim=(-0.05, 1.05),
                 title=f"{w}: speed vs fidelity")
        _scatter(likely, per_method, points, "target_log_likelihood")
        likely.set(xlabel="tokens/s", ylabel="target log-likelihood / token",
                   title=f"{w}: speed vs drift")
    fig.tight_layout()
    return fig


def draft_source_figure(summary: dict):
    """The share of rounds each draft source proposed, per method that mixes sources."""
    fig, axes = _axes(len(summary))
    for ax, (w, per_method) in zip(axes, summary.items(), strict=True):
        mixed = {m: x["draft_sources"] for m, x in per_method.items() if x.get("draft_sources")}
        kinds = sorted({k for mix in mixed.values() for k in mix})
        bottom = [0.0] * len(mixed)
        for kind in kinds:
            shares = [mix.get(kind, 0) / sum(mix.values()) for mix in mixed.values()]
            ax.bar(range(len(mixed)), shares, bottom=bottom, label=kind)
            bottom = [b + x for b, x in zip(bottom, shares, strict=True)]
        ax.set_xticks(range(len(mixed)))
        ax.set_xticklabels(list(mixed), rotation=45, ha="right", fontsize=7)
        ax.set(ylabel="share of rounds", ylim=(0, 1.05), title=f"{w}: draft sources")
        if kinds:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def figures(summary: dict, asd_methods: dict[str, str]) -> dict:
    """file stem -> figure. ``asd_methods``: ASD method -> the strict method it approximates.
    The ASD frontier needs an ASD method, the draft-source mix a method that mixes sources."""
    out = {"speedup": speedup_figure(summary), "acceptance_per_position": acceptance_figure(summary),
           "draft_lengths": draft_length_figure(summary)}
    if asd_methods:
        out["asd_frontier"] = asd_frontier_figure(summary, asd_methods)
    if any(len(x.get("draft_sources") or {}) > 1 for w in summary.values() for x in w.values()):
        out["draft_sources"] = draft_source_figure(summary)
    return out

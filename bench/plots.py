"""The harnesses' PNG figures (matplotlib, Agg): the engine's from a run's summary (workload ->
method -> metrics, ``bench.metrics.summarise``), the served harness's against concurrency."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MAIN = ("ngram", "fixed_4", "heuristic", "pacer", "pacer_no_position", "pacer_rho_ablation",
        "dflash_fixed", "suffix_cold", "suffix_warm", "hybrid_pacer")


def panels(n: int, width: float = 5.0, height: float = 3.8):
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, list(axes[0])


def save(fig, path: Path, dpi: int = 110) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def speedup(summary: dict):
    """tokens/s over ar's, one bar per method, a group per workload."""
    workloads = list(summary)
    methods = list(dict.fromkeys(m for w in workloads for m in summary[w]))
    fig, (ax,) = panels(1, max(6.0, 0.6 * len(methods) + 2), 4)
    width = 0.8 / max(len(workloads), 1)
    for i, w in enumerate(workloads):
        ratios = [summary[w].get(m, {}).get("ratio_to_ar") or 0.0 for m in methods]
        ax.bar([j + i * width for j in range(len(methods))], ratios, width, label=w)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks([j + width * (len(workloads) - 1) / 2 for j in range(len(methods))])
    ax.set_xticklabels(methods, rotation=45, ha="right")
    ax.set(ylabel="tokens/s vs ar", title="Speedup over our AR (median over repeats)")
    ax.legend()
    return fig


def acceptance(summary: dict):
    """Acceptance rate at each draft position for the main speculative methods."""
    fig, axes = panels(len(summary))
    for ax, (w, per_method) in zip(axes, summary.items(), strict=True):
        for m in MAIN:
            if rates := per_method.get(m, {}).get("acceptance_at"):
                ax.plot(range(len(rates)), rates, "o-", label=m)
        ax.set(xlabel="position in draft", ylabel="acceptance rate", ylim=(0, 1.05), title=w)
        ax.legend(fontsize=7)
    return fig


def asd_frontier(summary: dict, asd_methods: dict[str, str]):
    """tokens/s against quality for each ASD method and the strict one it approximates: pass@1,
    and per workload the share of outputs equal to AR's and the target log-likelihood."""
    points = list(dict.fromkeys(["ar", *asd_methods.values(), *asd_methods]))
    panes = [("humaneval", "pass_at_1", "pass@1", "HumanEval: speed vs pass@1")]
    for w in summary:
        panes += [(w, "same_as_ar", "share of outputs equal to AR", f"{w}: speed vs fidelity"),
                  (w, "target_log_likelihood", "target log-likelihood / token",
                   f"{w}: speed vs drift")]
    fig, axes = panels(len(panes), 4.2)
    for ax, (w, key, label, title) in zip(axes, panes, strict=True):
        per_method = summary.get(w, {})
        for m in points:
            if (y := per_method.get(m, {}).get(key)) is not None:
                x = per_method[m]["tokens_per_s"]
                ax.plot(x, y, "o")
                ax.annotate(m, (x, y), fontsize=7)
        ax.set(xlabel="tokens/s", ylabel=label, title=title)
    return fig


def engine_figures(summary: dict, asd_methods: dict[str, str]) -> dict:
    """file stem -> figure; the ASD frontier needs an ASD method (``asd_methods``: ASD method ->
    the strict method it approximates)."""
    out = {"speedup": speedup(summary), "acceptance_per_position": acceptance(summary)}
    if asd_methods:
        out["asd_frontier"] = asd_frontier(summary, asd_methods)
    return out


def concurrency(summary: dict):
    """Served aggregate tokens/s and p50 / p95 latency against clients, a colour per method."""
    fig, (left, right) = panels(2, 5.0, 4.0)
    colours = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4)
    for method, levels in summary.items():
        cs = sorted(levels)
        if len(cs) < 2:
            continue
        colour = next(colours)
        left.plot(cs, [levels[c]["tokens_per_s"] for c in cs], marker="o", color=colour,
                  label=method)
        for k, style in (("p50", {"marker": "o"}), ("p95", {"linestyle": "--"})):
            right.plot(cs, [levels[c][f"{k}_s"] for c in cs], color=colour,
                       label=f"{method} {k}", **style)
    for ax, label in ((left, "aggregate tokens/s"), (right, "per-request latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="concurrent clients", ylabel=label)
        ax.legend()
    fig.suptitle("Served throughput and latency against concurrency")
    return fig

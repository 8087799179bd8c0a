"""PNG plots for MLflow: loss curves, per-position acceptance, calibration (matplotlib, Agg)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def loss_figure(history, title: str):
    """history: MLflow Metric objects (step, value)."""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    points = sorted((m.step, m.value) for m in history)
    ax.plot([p[0] for p in points], [p[1] for p in points])
    ax.set(xlabel="step", ylabel="loss", title=title)
    fig.tight_layout()
    return fig


def acceptance_figure(rates: list[float], title: str):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(range(len(rates)), rates)
    ax.set(xlabel="position in draft", ylabel="acceptance rate", ylim=(0, 1), title=title)
    fig.tight_layout()
    return fig


def calibration_figure(mean_pred: list[float], frac_pos: list[float], title: str):
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.plot([0, 1], [0, 1], "--", color="grey")
    ax.plot(mean_pred, frac_pos, "o-")
    ax.set(xlabel="predicted acceptance", ylabel="observed acceptance", title=title,
           xlim=(0, 1), ylim=(0, 1))
    fig.tight_layout()
    return fig


def histogram_figure(counts: dict[int, int], title: str):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    keys = sorted(counts)
    ax.bar(keys, [counts[k] for k in keys])
    ax.set(xlabel="draft length", ylabel="rounds", title=title)
    fig.tight_layout()
    return fig

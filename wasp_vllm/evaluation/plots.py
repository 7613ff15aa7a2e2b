"""Benchmark figures: FID over rounds per method, and accuracy (mean ± std over seeds) per method.

Figures are drawn on a bare ``matplotlib.figure.Figure`` (Agg canvas), never through
pyplot, so plotting works on a headless box and does not switch the backend of a
user's interactive session.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)


def _new_figure(width: float, height: float):  # -> matplotlib.figure.Figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150)
    log.info("wrote %s", out)
    return out


def plot_fid_rounds(fid_by_method: Mapping[str, Mapping[int | str, float]], path: str | Path) -> Path:
    """One line per method: FID of the cumulative synthetic set against the private set, per round.

    Round keys may be strings (as they come back from a JSON file).
    """
    fig = _new_figure(6.0, 4.0)
    ax = fig.add_subplot()
    for method, curve in fid_by_method.items():
        points = sorted((int(r), float(v)) for r, v in curve.items())
        if points:
            ax.plot([r for r, _ in points], [v for _, v in points], marker="o", label=method)
    ax.set_xlabel("round")
    ax.set_ylabel("FID (synthetic up to round vs private)")
    ax.set_title("FID over rounds (lower is closer to the private data)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if fid_by_method:
        ax.legend()
    return _save(fig, path)


def _bar(std: float | None) -> float:
    return 0.0 if std is None or math.isnan(float(std)) else float(std)


def plot_accuracy(
    results: Mapping[str, tuple[float, float | None]], path: str | Path, metric: str = "accuracy"
) -> Path:
    """Bar chart of a downstream score per method with ± std error bars (std None or NaN: no bar)."""
    names = list(results)
    means = [float(results[n][0]) for n in names]
    stds = [_bar(results[n][1]) for n in names]
    fig = _new_figure(max(5.0, 1.5 + 0.9 * len(names)), 4.0)
    ax = fig.add_subplot()
    bars = ax.bar(range(len(names)), means, yerr=stds, capsize=4, color="tab:blue", alpha=0.8)
    ax.bar_label(bars, labels=[f"{m:.3f}" for m in means], label_type="center", color="white", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel(metric)
    ax.set_ylim(0.0, min(1.05, max([m + s for m, s in zip(means, stds, strict=True)], default=1.0) + 0.1))
    ax.set_title(f"{metric} (mean ± std)")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)

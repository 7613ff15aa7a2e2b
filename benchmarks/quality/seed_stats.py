"""Aggregation over seeds and differences paired by seed, for the quality benchmarks: a gap
inside its standard deviation (or measured on one seed) is reported as "no gap"."""

from __future__ import annotations

import math
import statistics
from typing import Any

METRICS = ("macro_f1", "accuracy", "label_agreement", "fid")


def mean_std(values: list[float | None]) -> tuple[float, float | None]:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return math.nan, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def fmt(values: list[float | None], digits: int = 4) -> str:
    mean, std = mean_std(values)
    if math.isnan(mean):
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def paired_diff(a: dict[int, float | None], b: dict[int, float | None]) -> dict[str, Any] | None:
    """``a − b`` over the seeds both have (values by seed): diffs, mean, std and a verdict, "no gap"
    when the mean lies inside its standard deviation (or there is a single seed)."""
    seeds = sorted(s for s in set(a) & set(b) if a[s] is not None and b[s] is not None)
    diffs = [float(a[s]) - float(b[s]) for s in seeds]  # type: ignore[arg-type]
    mean, std = mean_std(list(diffs))
    if math.isnan(mean):
        return None
    gap = std is not None and abs(mean) > std
    return {"seeds": seeds, "diffs": diffs, "mean": mean, "std": std, "verdict": "gap" if gap else "no gap"}


def fmt_diff(d: dict[str, Any] | None, digits: int = 3) -> str:
    if d is None:
        return "-"
    spread = f" ± {d['std']:.{digits}f}" if d["std"] is not None else ""
    return f"{d['mean']:+.{digits}f}{spread}" + (" (no gap)" if d["verdict"] == "no gap" else "")

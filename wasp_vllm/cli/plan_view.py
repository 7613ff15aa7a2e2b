"""What ``generate --dry-run`` prints: a run's plan (privacy, quotas, tokens, wall time per engine),
and the end-of-run lines on where the work went.  Both print public facts only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from wasp_vllm.config.checks import machine_load_note
from wasp_vllm.pipeline.estimate import RunPlan

#: Below this share of generated samples kept, the summary warns that most of the work was thrown away.
LOW_KEPT_SHARE = 0.5


def duration(seconds: float) -> str:
    """'45 s', '12 min', '2.5 h'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def print_plan(plan: RunPlan, console: Console) -> None:
    """The plan as three tables and a total; nothing was loaded and no private data was read."""
    s = plan.summary
    console.print(
        f"[bold]Plan[/] ({escape(s['strategy'])}, task {escape(s['task'])}): N={s['n']} samples over "
        f"T={s['rounds']} rounds from {', '.join(map(escape, s['plms']))}, at most {s['max_new_tokens']} "
        "tokens each. Dry run: no model loaded, no private data read.",
        highlight=False,
    )
    console.print(f"guarantee: {escape(plan.guarantee)}", highlight=False)
    releases = Table(title="privacy: every release and its share of epsilon")
    for col in ("release", "count", "sigma", "sensitivity", "epsilon alone"):
        releases.add_column(col)
    for r in plan.releases:
        releases.add_row(
            r.what, str(r.count), f"{r.sigma:.3f}", f"{r.sensitivity:.4f}", f"{r.epsilon_alone:.3f}"
        )
    releases.caption = f"together: epsilon {plan.epsilon_exact:.3f} by the exact accountant"
    console.print(releases if plan.releases else "privacy: no release reads the private data")
    console.print(_quota_table(plan))
    moved = "" if plan.quotas_final else "after round 0 the noisy weights move them (here: equal weights); "
    console.print(f"quotas: {moved}{plan.labels}", highlight=False)
    _print_engines(plan, console)
    how = "generating side by side" if plan.concurrent else "one after the other"
    extra = f", {duration(plan.dequantize_s)} to dequantize packaged models once" if plan.dequantize_s else ""
    console.print(
        f"estimated wall time: [bold]{duration(plan.total_s)}[/] (engines {how}; "
        f"{duration(plan.overhead_s)} embedding and writing{extra}); {plan.tokens:,} tokens",
        highlight=False,
    )
    if note := machine_load_note():
        console.print(f"[bold yellow]note:[/] {escape(note)}", highlight=False)


def _quota_table(plan: RunPlan) -> Table:
    plms = plan.summary["plms"]
    table = Table(title="samples asked per round and PLM")
    for col in ("round", *plms, "total"):
        table.add_column(escape(col))
    for t, quotas in enumerate(plan.quotas):
        table.add_row(str(t), *(str(quotas[p]) for p in plms), str(sum(quotas.values())))
    return table


def _print_engines(plan: RunPlan, console: Console) -> None:
    """The engine table where the terminal is wide enough for it, else one line per PLM (the table's
    ten columns wrapped into six-character ones at 80 columns)."""
    table = _engine_table(plan)
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum  # unwrapped
    if natural <= console.width:
        console.print(table)
        return
    console.print(f"[italic]{table.title}[/]", highlight=False)
    for e in plan.engines:
        here = e.resolves if len(e.resolves) < 12 else "not here (see below)"
        line = Text.from_markup(
            f"[bold]{escape(e.plm)}[/] ({e.engine}, {escape(here)}): {e.samples} samples, {e.generated} "
            f"generated, {e.tokens:,} tokens at {e.tokens_per_s:.0f} tok/s; start-up "
            f"{duration(e.startup_s)}, wall {duration(e.wall_s)}; throughput from {escape(e.source)}"
        )
        console.print(Padding(line, (0, 0, 0, 2)), highlight=False)  # a PLM's wrapped lines stay indented
    if table.caption:
        console.print(table.caption, highlight=False)


def _engine_table(plan: RunPlan) -> Table:
    table = Table(title="engines: tokens and wall time (throughput assumed, and where it comes from)")
    for col in ("PLM", "engine", "here", "samples", "generated", "tokens", "tok/s", "start-up", "wall",
                "throughput from"):  # fmt: skip
        table.add_column(col, overflow="fold")
    for e in plan.engines:
        here = e.resolves if len(e.resolves) < 12 else "no (see below)"
        numbers = (str(e.samples), str(e.generated), f"{e.tokens:,}", f"{e.tokens_per_s:.0f}")
        times = (duration(e.startup_s), duration(e.wall_s))
        table.add_row(escape(e.plm), e.engine, here, *numbers, *times, escape(e.source))
    missing = [e for e in plan.engines if e.resolves.startswith("no")]
    table.caption = "\n".join(escape(e.resolves.removeprefix("no: ")) for e in missing) or None
    return table


def print_work(work: Mapping[str, Mapping[str, Any]], console: Console) -> None:
    """Where the work went (the manifest's ``work``): samples and tokens generated against kept, per
    PLM, and a warning if most of it was thrown away."""
    if not work:
        return
    parts = []
    for plm, w in work.items():
        share = w.get("kept_share")
        parts.append(
            f"{escape(plm)} kept {w['kept']} of {w['generated']} samples ({_pct(share)}), "
            f"{w['kept_tokens']:,} of {w['tokens']:,} tokens"
        )
    console.print("work: " + "; ".join(parts), highlight=False)
    generated = sum(w["generated"] for w in work.values())
    kept = sum(w["kept"] for w in work.values())
    if generated and kept / generated < LOW_KEPT_SHARE:
        console.print(
            f"[bold yellow]most of the generation was thrown away[/] ({_pct(kept / generated)} kept): "
            "see the rejects by reason in the manifest or `wasp-vllm report`",
            highlight=False,
        )


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f} %"

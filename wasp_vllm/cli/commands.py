"""The commands beside ``generate``: evaluate, hotpate, privacy, tasks, report, doctor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from wasp_vllm.cli.app import app, console, friendly_errors, setup_logging
from wasp_vllm.cli.options import settings_command
from wasp_vllm.config import RunConfig, build_settings
from wasp_vllm.evaluation.settings import EvalSettings
from wasp_vllm.hotpate.options import HotPateOptions
from wasp_vllm.report.settings import ReportSettings
from wasp_vllm.tasks.spec import PromptKind

if TYPE_CHECKING:
    from wasp_vllm.evaluation.results import SyntheticScores
    from wasp_vllm.strategies import Strategy


@app.command()
@settings_command(EvalSettings)
def evaluate(
    settings: dict[str, Any],
    synthetic: Annotated[Path, typer.Option(help="synthetic.parquet written by `generate`.")],
    out: Annotated[
        Path | None,
        typer.Option(
            help="Write the whole report here as JSON (mode 0600), the operator's own figures "
            "(operator_only: FID against the private records, a private reference's label agreement) "
            "included; the printed report leaves them out."
        ),
    ] = None,
) -> None:
    """Train a task model on the synthetic set and score it on real test data (accuracy, macro-F1, FID)."""
    setup_logging(False)
    with friendly_errors():
        from wasp_vllm.api import run_defaults, synthetic_task
        from wasp_vllm.evaluation import evaluate_synthetic

        # The run's own task (as its manifest records it) unless --task names another, and its M
        # and seed: a default the user never chose would score on other labels or other records.
        task = synthetic_task(synthetic, settings.get("task"))
        settings = run_defaults(synthetic) | settings | {"task": settings.get("task") or task.name}
        # An EvaluationError is a ValueError: friendly_errors turns it into one line and exit 2.
        report = evaluate_synthetic(synthetic, build_settings(EvalSettings, settings), task=task)
        _print_report(report, out)


@app.command()
@settings_command(HotPateOptions)
def hotpate(
    settings: dict[str, Any],
    out: Annotated[Path, typer.Option(help="Output directory (synthetic.parquet, manifest.json).")] = Path(
        "runs/hotpate"
    ),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run already in --out.")] = False,
) -> None:
    """Hot PATE: synthetic records from DP aggregation of many teachers' next-token distributions."""
    setup_logging(False)
    with friendly_errors():
        from wasp_vllm.data.records import Columns, load_private
        from wasp_vllm.hotpate.generate import TeacherModel, run_hotpate
        from wasp_vllm.hotpate.prompts import subject_for
        from wasp_vllm.hotpate.report import publish
        from wasp_vllm.pipeline.store import RunStore
        from wasp_vllm.privacy.sampling import voting_neighbour
        from wasp_vllm.tasks import get_task

        o = build_settings(HotPateOptions, settings)
        spec = get_task(o.task)
        columns = Columns(o.text_col, o.label_col)
        data = load_private(o.private, spec, columns, limit=o.private_limit, seed=o.seed)
        store = RunStore(out)
        # Hot PATE never resumes nor takes --seed: its noise key and the folder lock end with the block
        with store.prepared(resume=False, overwrite=overwrite), store.one_shot_secret() as secret:
            # The --m draw swaps at most one record, which may touch two teachers: replace neighbours.
            table, report = run_hotpate(
                data.texts, [spec.labels[i] for i in data.labels], spec.labels,
                teacher=TeacherModel(o.model, o.engine), task=subject_for(spec.name),
                neighbour=voting_neighbour("add_remove", selected=True).value,
                noise_rng=secret.generator("hotpate"), **o.run_settings(),
            )  # fmt: skip
            console.print(publish(out, table, report, o.private_limit), markup=False)


#: The run settings that decide sigma (``wasp-vllm privacy``: generate's options and defaults).
PRIVACY_SETTINGS = ("epsilon", "delta", "rounds", "q", "max_records_per_user", "utility_check_share")


@app.command()
@settings_command(RunConfig, PRIVACY_SETTINGS)
def privacy(settings: dict[str, Any]) -> None:
    """Print the noise scale sigma under both accountants for these settings."""
    with friendly_errors():
        from wasp_vllm.privacy.accountant import PrivacyUnit
        from wasp_vllm.privacy.plan import VoteShape, plan_privacy, released_histograms

        cfg = build_settings(RunConfig, settings)
        epsilon, delta, rounds, q = cfg.epsilon, cfg.delta, cfg.rounds, cfg.q
        per_unit = cfg.privacy.records_per_unit
        table = Table(title=f"eps={epsilon}, delta={delta}, T={rounds}, Q={q}")
        columns = ("accountant", "neighbour", "released", "sensitivity", "sigma", "eps spent (exact)")
        for col in columns:
            table.add_column(col)
        # H_near alone: runs whose prompts never show the far pool (--far-votes auto: all but contrastive)
        for mode, neighbour, histograms in (("paper", "add_remove", 2), ("exact", "add_remove", 2),
                                            ("exact", "replace", 2), ("exact", "add_remove", 1),
                                            ("exact", "replace", 1)):  # fmt: skip
            unit = PrivacyUnit(neighbour, per_unit)
            plan = plan_privacy(epsilon, delta, rounds, q, mode, unit, votes=VoteShape(histograms))
            sigma = "-" if plan.sigma is None else f"{plan.sigma:.3f}"
            released, spent = released_histograms(histograms), f"{plan.epsilon_exact_spent:.3f}"
            table.add_row(mode, neighbour, released, f"{plan.sensitivity:.4f}", sigma, spent)
        Console().print(table)
        _print_run_sigma(cfg)


def _print_run_sigma(cfg: RunConfig) -> None:
    """The sigma ``generate`` with these settings would use: its defaults draw --m records (so the
    voters' relation is *replace*) and release what its prompts need (H_near, and H_far with them)."""
    from wasp_vllm.pipeline.context import large_epsilon, privacy_plan

    plan = privacy_plan(cfg)
    sigma = "no noise (no voting round)" if plan.sigma is None else f"sigma {plan.sigma:.3f}"
    why = f"--m {cfg.private_limit} draw" if cfg.private_limit is not None else "every record votes"
    Console().print(
        f"generate with these settings (and its defaults) adds {sigma}: {plan.mode} accountant, "
        f"{plan.neighbour} ({why}), {plan.histograms} histogram(s) per vote",
        highlight=False,
    )
    if plan.utility_sigma is not None:
        Console().print(
            f"its utility check (--utility-check-share {cfg.utility_check_share:g}) adds sigma "
            f"{plan.utility_sigma:.3f} to each cell of its confusion matrices (sensitivity "
            f"{plan.utility_sensitivity:.3f}); the votes take the rest of the budget",
            highlight=False,
        )
    if warning := large_epsilon(cfg.epsilon):
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)


@app.command()
def strategies() -> None:
    """List the methods `--strategy` accepts: WASP, its ablations and the baselines."""
    from wasp_vllm.strategies import STRATEGIES

    table = Table(title="strategies (generate --strategy NAME)")
    for col in ("name", "what it does", "votes (Q)", "prompt after round 0", "re-weights PLMs"):
        table.add_column(col)
    for s in STRATEGIES.values():
        q = ("--q" if s.top_q is None else str(s.top_q)) if s.votes else "never"
        table.add_row(s.name, s.summary, q, _later_prompt(s), "yes" if s.reweights else "no")
    Console().print(table)


def _later_prompt(strategy: Strategy) -> str:
    """The prompt a default run of ``strategy`` uses after round 0, and what --later-prompt may change."""
    default = strategy.resolve_later_prompt("auto").value
    if not strategy.chooses_later_prompt:
        return default
    others = [k.value for k in PromptKind if k.value != default]
    return f"{default} (default; or --later-prompt {' / '.join(others)})"


@app.command()
def tasks(
    template: Annotated[
        str | None,
        typer.Option(
            help="Write a commented task file for a new task NAME (to NAME.toml, or --out).", metavar="NAME"
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Where --template writes (a .toml file).")] = None,
    check: Annotated[
        Path | None, typer.Option(help="Load a task file and show its labels, or say what is wrong.")
    ] = None,
) -> None:
    """List the built-in tasks with their labels; write a task file to start from; check one."""
    from wasp_vllm.tasks import get_task, list_tasks

    if template is not None or check is not None:
        _task_file(template, out, check)
        return
    from wasp_vllm.data.suite import SUITE

    table = Table(title="tasks (or pass a TOML/YAML task file to --task)")
    for col in ("name", "labels", "attribute", "built-in data", "suite group"):
        table.add_column(col)
    for name in list_tasks():
        spec = get_task(name)
        # The suite's groups: defaults are chosen on the validation splits of 'choosing' tasks only;
        # 'held-out' tasks' test splits are scored once, at the end (docs/suite.md).
        data = f"{name}:fit|validation|test" if name in SUITE else "-"
        table.add_row(name, ", ".join(spec.labels), spec.attribute_name or "-", data, SUITE.get(name, "-"))
    Console().print(table)


def _task_file(template: str | None, out: Path | None, check: Path | None) -> None:
    """``tasks --template NAME`` and ``tasks --check FILE``."""
    from wasp_vllm.tasks import get_task
    from wasp_vllm.tasks.prompts import example_prompts
    from wasp_vllm.tasks.template import write_task_template

    with friendly_errors():
        if template is not None:
            path = write_task_template(template, out)
            console.print(
                f"wrote {path}: edit its labels and prompts, then `wasp-vllm tasks --check {path}`; "
                f"run it with --task {path} --private YOUR_FILE",
                highlight=False,
            )
            return
        assert check is not None
        spec = get_task(str(check))
        console.print(f"{check}: task {spec.name!r}, labels {', '.join(spec.labels)}", highlight=False)
        for heading, prompt in example_prompts(spec).items():  # as a PLM gets it, before its chat template
            console.print(f"\n{heading}:", markup=False)
            console.print(prompt, markup=False, highlight=False, soft_wrap=True)  # its own lines, unwrapped


@app.command()
@settings_command(ReportSettings)
def report(
    settings: dict[str, Any],
    run_dir: Annotated[Path, typer.Argument(help="A finished run (its --out folder).")],
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for index.html and its PNGs (default RUN_DIR/report; RUN_DIR/private/report "
            "with --private)."
        ),
    ] = None,
) -> None:
    """Write an HTML report of a run (a folder: index.html and its PNGs): rounds, weights, privacy."""
    setup_logging(False)
    with friendly_errors():
        from wasp_vllm.report.page import render_report

        chosen = build_settings(ReportSettings, settings)
        page = render_report(run_dir, out, chosen)
        console.print(f"report written to {page}", highlight=False)
        if chosen.private is not None:
            console.print(
                "[bold red]operator only:[/] this report holds FID against the raw private records; "
                "do not share it",
                highlight=False,
            )


@app.command()
def doctor() -> None:
    """Show what is usable on this machine (devices, engines, models, embedders, data) and why not."""
    setup_logging(False)
    from rich.markup import escape

    from wasp_vllm.ops.doctor import GROUPS, diagnose, verdict

    rows = diagnose()
    colours = {"ok": "green", "missing": "yellow", "unusable": "red"}
    table = Table(title="wasp-vllm doctor")
    for col in ("component", "status", "detail"):
        table.add_column(col, overflow="fold")
    for group in GROUPS:
        members = [r for r in rows if r.group == group]
        for row in members:
            status = f"[{colours.get(row.status, 'white')}]{row.status}[/]"
            table.add_row(escape(row.component), status, escape(row.detail))
        if members and group != GROUPS[-1]:
            table.add_section()
    Console().print(table)
    can, why = verdict(rows)
    Console().print(f"[bold {'green' if can else 'red'}]{escape(why)}[/]", highlight=False)
    if not can:
        raise typer.Exit(1)


def _print_report(report: SyntheticScores, out: Path | None) -> None:
    """What is printed may be pasted anywhere: the report without its operator_only section, which
    goes only into ``out`` (a file only its owner may read)."""
    from wasp_vllm.pipeline.store import write_private_json

    if out is not None:
        write_private_json(out, report.to_json())
    if report.operator is not None:
        where = f"in {out}" if out is not None else "not shown: pass --out FILE to keep them"
        console.print(f"operator-only figures (FID against the private records, ...) {where}", markup=False)
    typer.echo(json.dumps(report.published(), indent=2, default=str))
    if (reading := report.reading()) is not None:
        console.print(f"macro-F1 {report.macro_f1:.3f}: {reading}", highlight=False)


def _echo_json(report: dict[str, Any], out: Path | None) -> None:
    """Print a report as JSON, and write it to ``out`` too when given."""
    text = json.dumps(report, indent=2, default=str)
    if out is not None:
        out.write_text(text + "\n")
    typer.echo(text)

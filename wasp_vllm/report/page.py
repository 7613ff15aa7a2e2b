"""``wasp-vllm report``: one HTML page about a finished run, in a folder with its PNGs.

It reads the run's published files only (``manifest.json``, ``synthetic.parquet``), so the page is
publishable like them: per-round quotas and PLM weights, label balance, rejects of the quality gate,
the privacy spent, and a few samples per label and PLM.  With ``private`` it adds the operator's FID
per round, computed on the raw private records outside the DP accounting; that page is then the
operator's own and says so under a red banner (and goes to ``RUN_DIR/private/report`` by default).
The PNGs lie beside ``index.html`` and are referenced relatively; the page loads nothing else.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

from wasp_vllm.privacy.plan import released_histograms
from wasp_vllm.report import plots as report_plots
from wasp_vllm.report.plots import (
    CSS,
    OPERATOR_BANNER,
    PUBLIC_BANNER,
    cards,
    definition_table,
    fmt,
    rounds_table,
    sharing_section,
    table,
)
from wasp_vllm.report.run_view import (
    OperatorFigures,
    ReportError,
    RunView,
    label_counts,
    load_run,
    operator_fid,
)
from wasp_vllm.report.settings import ReportSettings

WEIGHTS_PNG, LABELS_PNG, FID_PNG, WORK_PNG = "weights.png", "labels.png", "fid.png", "work.png"
UTILITY_PNG = "utility.png"
SAMPLES_PER_CELL = 3
OPERATOR_NOTE = (
    "computed on the raw private records outside the differential-privacy accounting: the "
    "operator's figures, NEVER to be published"
)


def default_out(run_dir: Path, operator: bool) -> Path:
    """``RUN_DIR/report``; an operator's report (with FID) goes under the run's ``private/`` folder."""
    return run_dir / "private" / "report" if operator else run_dir / "report"


def render_report(run_dir: Path, out: Path | None = None, settings: ReportSettings | None = None) -> Path:
    """Write ``index.html`` and its PNGs into ``out``; return the page's path.  With ``settings``
    naming the private set, the page adds the operator's FID per round (and is theirs alone)."""
    view = load_run(Path(run_dir))
    settings = settings or ReportSettings()
    if out is not None:  # before the operator's FID is computed
        check_out(Path(out))
    figures = operator_fid(view, settings) if settings.private is not None else None
    out = Path(out) if out is not None else default_out(view.run_dir, figures is not None)
    out.mkdir(parents=True, exist_ok=True)
    report_plots.plot_weights(view.manifest.get("rounds", []), view.plms, out / WEIGHTS_PNG)
    report_plots.plot_labels(label_counts(view), view.plms, out / LABELS_PNG)
    report_plots.plot_work(view.manifest.get("rounds", []), view.plms, out / WORK_PNG)
    if (check := view.privacy.utility_check) is not None:
        report_plots.plot_utility(check, out / UTILITY_PNG)
    if figures is not None:
        report_plots.plot_fid(figures.fid_by_round, out / FID_PNG)
    else:  # an operator's figure must never sit beside a publishable page
        (out / FID_PNG).unlink(missing_ok=True)
    page = out / "index.html"
    page.write_text(build_html(view, figures), encoding="utf-8")
    return page


def check_out(out: Path) -> None:
    """The report is a folder (``index.html`` and its PNGs): refuse a page name or a file there
    before anything is computed or written."""
    if out.suffix.lower() in (".html", ".htm") and not out.is_dir():
        raise ReportError(
            f"--out {out}: the report is a folder (index.html and its PNGs); pass a folder, "
            f"e.g. --out {out.with_suffix('')}"
        )
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out} exists and is not a folder; choose another path")


def build_html(view: RunView, figures: OperatorFigures | None) -> str:
    """The whole page: header, banners, then one section per topic."""
    title = f"WASP run report: {view.run_dir.name}"
    body = [
        _header(view, title),
        OPERATOR_BANNER if figures is not None else PUBLIC_BANNER,
        _void_banner(view),
        _privacy_section(view),
        _utility_section(view),
        _rounds_section(view),
        _labels_section(view),
        _rejects_section(view),
        report_plots.work_section(view.manifest.get("rounds", []), view.plms, WORK_PNG),
        _samples_section(view),
        _fid_section(figures) if figures is not None else "",
        sharing_section(operator=figures is not None),
        _footer(view),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n"
        f"<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(part for part in body if part)
        + "\n</main>\n</body>\n</html>\n"
    )


def _header(view: RunView, title: str) -> str:
    cfg, manifest = view.config, view.manifest
    dropped = manifest.get("plms", {}).get("dropped") or {}
    plms = ", ".join(p + (" (dropped)" if p in dropped else "") for p in view.plms)
    rows = manifest.get("output", {}).get("rows", len(view.rows))
    done = len(manifest.get("rounds", []))
    facts = {
        "task": manifest.get("task", cfg.get("task", "?")),
        "strategy": cfg.get("strategy", "?"),
        "PLMs": plms,
        "N": f"{rows} written (asked {cfg.get('n', '?')})",
        "rounds": f"{done} of T={cfg.get('rounds', '?')}",
        "finished": view.finished_at.strftime("%Y-%m-%d %H:%M UTC"),
    }
    items = "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(str(v))}</dd></div>" for k, v in facts.items())
    return f'<header><h1>{escape(title)}</h1><dl class="facts">{items}</dl></header>'


def _void_banner(view: RunView) -> str:
    privacy = view.privacy
    if not privacy.epsilon_void:
        return ""
    why = privacy.guarantee.removeprefix("VOID:").strip()
    return (
        f'<div class="banner void"><strong>ε VOID:</strong> {escape(why)}. '
        "This run carries no privacy guarantee; do not use its output as private data.</div>"
    )


def _privacy_section(view: RunView) -> str:
    privacy = view.privacy
    plan, ledger = privacy.plan, privacy.ledger
    # The votes' noise is the plan's; a label-prior histogram has a noise of its own (below).
    headline = {
        "ε spent": f"{fmt(privacy.epsilon_spent)} of {fmt(plan.epsilon)}",
        "δ": fmt(privacy.delta),
        "σ (noise)": fmt(plan.sigma),
        "sensitivity": fmt(plan.sensitivity),
        "accountant": privacy.accountant,
    }
    details = {
        "guarantee": privacy.guarantee,
        "ε spent, exact accountant": fmt(ledger.epsilon_spent_exact),
        "ε by the paper's formula": fmt(ledger.epsilon_spent_paper),
        "neighbouring relation": ", ".join(ledger.neighbours) or plan.neighbour,
        "compositions (voting rounds)": ledger.compositions,
        "histograms each vote releases": released_histograms(plan.histograms),
        **(
            {"label histogram (σ, sensitivity)": f"{fmt(plan.prior_sigma)}, {fmt(plan.prior_sensitivity)}"}
            if plan.prior_sigma is not None
            else {}
        ),
        "noise": privacy.noise,
    }
    parts = [
        '<section id="privacy"><h2>Privacy spent</h2>',
        cards(headline, void=["ε spent"] if privacy.epsilon_void else []),
        definition_table(details),
        "<h3>Neighbourhood (what the guarantee is about)</h3>",
        definition_table(asdict(privacy.neighbourhood)),
    ]
    if privacy.federated:
        parts += ["<h3>Federated voting</h3>", definition_table(dict(privacy.federated))]
    return "\n".join(parts) + "</section>"


def _utility_section(view: RunView) -> str:
    """The utility check's figures on the private records (released with noise, in the ledger)."""
    check = view.privacy.utility_check
    if check is None:
        return ""
    rows = [[s.name, str(s.macro_f1), str(s.accuracy)] for s in check.sets]
    return (
        '<section id="utility"><h2>Utility check on the private records</h2>'
        "<p>Task models trained on the synthetic set, on round 0's zero-shot samples alone, and the "
        "nearest label description, each scored on the records that voted through noisy confusion "
        f"matrices (part of the privacy spent above); {check.confidence:.0%} intervals cover the noise "
        f"and the sampling error. The synthetic set is {escape(check.reading())}.</p>"
        f'<img src="{UTILITY_PNG}" alt="macro-F1 on the private records with intervals" width="560">'
        f"{table(['task model from', 'macro-F1', 'accuracy'], rows)}</section>"
    )


def _rounds_section(view: RunView) -> str:
    rounds = view.manifest.get("rounds", [])
    final = view.manifest.get("plms", {}).get("final_weights")
    dropped = view.manifest.get("plms", {}).get("dropped") or {}
    notes = "".join(
        f"<p class='note'>{escape(p)} was dropped: {escape(str(r))}</p>" for p, r in dropped.items()
    )
    final_line = ""
    if final:
        pairs = ", ".join(f"{p} {fmt(w)}" for p, w in zip(view.plms, final, strict=False))
        final_line = f"<p>Final weights: {escape(pairs)}.</p>"
    return (
        '<section id="rounds"><h2>Rounds: quotas and PLM weights</h2>'
        "<p>Each round every PLM writes its quota; the noisy votes of the private records then set the "
        "weights, hence the quotas of the next round.</p>"
        f'<img src="{WEIGHTS_PNG}" alt="PLM weights and quotas per round" width="990">'
        f"{rounds_table(rounds, view.plms)}{final_line}{notes}</section>"
    )


def _labels_section(view: RunView) -> str:
    counts = label_counts(view)
    head = ["label", *view.plms, "total"]
    body = [[label, *(c.get(p, 0) for p in view.plms), sum(c.values())] for label, c in counts.items()]
    totals = ["all", *(sum(c.get(p, 0) for c in counts.values()) for p in view.plms), len(view.rows)]
    return (
        '<section id="labels"><h2>Label balance</h2>'
        f'<img src="{LABELS_PNG}" alt="synthetic samples per label and PLM">'
        f"{table(head, [*body, totals], last_is_total=True)}</section>"
    )


def _samples(view: RunView) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Up to ``SAMPLES_PER_CELL`` samples per (label, PLM), from the latest rounds first."""
    ordered = sorted(view.rows, key=lambda r: -int(r.get("round") or 0))
    picked: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in ordered:
        cell = picked.setdefault((str(row.get("label")), str(row.get("plm"))), [])
        if len(cell) < SAMPLES_PER_CELL:
            cell.append(row)
    return picked


def _rejects_section(view: RunView) -> str:
    """Samples turned down (and regenerated), by reason and PLM, over all rounds."""
    rounds = view.manifest.get("rounds", [])
    if not any("rejects" in r for r in rounds):
        return (
            '<section id="rejects"><h2>Rejects</h2><p class="note">No quality gate in this run.</p></section>'
        )
    totals: dict[str, dict[str, int]] = {}
    for record in rounds:
        for plm, reasons in (record.get("rejects") or {}).items():
            for reason, count in reasons.items():
                cell = totals.setdefault(reason, {})
                cell[plm] = cell.get(plm, 0) + int(count)
    if not totals:
        body = "<p>No sample was turned down.</p>"
    else:
        rows = [[r, *(c.get(p, 0) for p in view.plms), sum(c.values())] for r, c in sorted(totals.items())]
        rows.append(["all", *(sum(c.get(p, 0) for c in totals.values()) for p in view.plms),
                     sum(sum(c.values()) for c in totals.values())])  # fmt: skip
        body = table(["reason", *view.plms, "total"], rows, last_is_total=True)
    return (
        '<section id="rejects"><h2>Rejects</h2><p>Samples turned down, summed over the rounds: '
        "empty ones, copies and echoes of the prompt always; as <code>off_label</code>, the label "
        f"check. Each was regenerated, never copied.</p>{body}</section>"
    )


def _quote(row: dict[str, Any]) -> str:
    meta = f"round {row.get('round')} · {row.get('prompt_kind', '')}"
    return (
        f"<blockquote>{escape(str(row.get('text', '')))}<div class='meta'>{escape(meta)}</div></blockquote>"
    )


def _samples_section(view: RunView) -> str:
    picked, boxes = _samples(view), []
    for label in view.labels:
        for plm in view.plms:
            quotes = "".join(_quote(r) for r in picked.get((label, plm), [])) or "<p class='note'>none</p>"
            boxes.append(f"<div class='sample-box'><h4>{escape(label)} · {escape(plm)}</h4>{quotes}</div>")
    return (
        f'<section id="samples"><h2>Samples</h2><p>Up to {SAMPLES_PER_CELL} synthetic samples per label '
        "and PLM, latest rounds first (the synthetic set is public).</p>"
        f"<div class='samples'>{''.join(boxes)}</div></section>"
    )


def _fid_section(figures: OperatorFigures) -> str:
    rows = [[t, float(v)] for t, v in sorted(figures.fid_by_round.items())]
    settings = {
        "private source": figures.source,
        "M (--m)": figures.m if figures.m is not None else "every record",
        "seed of the draw": figures.seed,
        "private records compared": figures.n_private,
        "embedder": figures.embedder,
    }
    return (
        '<section id="fid" class="operator"><h2>FID per round (operator only)</h2>'
        f'<p class="warn"><strong>Operator only:</strong> {escape(OPERATOR_NOTE)}.</p>'
        f'<img src="{FID_PNG}" alt="FID per round against the private set">'
        f"{table(['round (cumulative)', 'FID'], rows)}{definition_table(settings)}</section>"
    )


def _footer(view: RunView) -> str:
    output = view.manifest.get("output", {})
    versions = ", ".join(f"{k} {v}" for k, v in sorted((view.manifest.get("versions") or {}).items()))
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"<footer><p>{escape(str(output.get('file', 'synthetic.parquet')))} sha256 "
        f"<code>{escape(str(output.get('sha256', '?')))}</code></p>"
        f"<p>versions: {escape(versions or '?')}</p><p>report made {made} by <code>wasp-vllm report</code>"
        "</p></footer>"
    )

"""The pictures and tables of ``wasp-vllm report``: PNG figures and the page's HTML building blocks.

Figures (PLM weights and quotas per round, label balance, FID per round) are drawn on a bare
``matplotlib.figure.Figure`` with the Agg canvas (never pyplot), so they render on a headless box
without touching the backend of a user's interactive session.  The building blocks (the page's CSS,
tables, headline cards) escape every value they are given: labels, PLM names and samples are
arbitrary text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wasp_vllm.privacy.utility import UtilityFigures

#: One colour per PLM, in the order of the run's ``plms`` (matplotlib's default cycle).
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def plot_weights(rounds: Sequence[Mapping[str, Any]], plms: Sequence[str], path: Path) -> Path:
    """Left: each PLM's weight before every round and after the last; right: its quota per round."""
    fig = _figure(9.0, 3.4)
    left, right = fig.subplots(1, 2)
    xs = [int(r["round"]) for r in rounds]
    for i, plm in enumerate(plms):
        weights = [float(r["weights_before"][i]) for r in rounds]
        if rounds:
            weights.append(float(rounds[-1]["weights_after"][i]))
        left.plot(range(len(weights)), weights, marker="o", color=_colour(i), label=plm)
    left.set_xticks(range(len(xs) + 1), [f"{x}" for x in xs] + ["end"])
    left.set(xlabel="before round", ylabel="weight", title="PLM weights", ylim=(0, 1.05))
    left.grid(alpha=0.3)
    left.legend(fontsize="small")
    width = 0.8 / max(len(plms), 1)
    for i, plm in enumerate(plms):
        quotas = [int(r["quotas"].get(plm, 0)) for r in rounds]
        offsets = [x - 0.4 + width * (i + 0.5) for x in xs]
        right.bar(offsets, quotas, width=width, color=_colour(i), label=plm)
    right.set_xticks(xs, [str(x) for x in xs])
    right.set(xlabel="round", ylabel="samples asked", title="Quota per round")
    right.yaxis.get_major_locator().set_params(integer=True)
    right.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def plot_labels(counts: Mapping[str, Mapping[str, int]], plms: Sequence[str], path: Path) -> Path:
    """Stacked bars: synthetic samples per label, one colour per PLM."""
    labels = list(counts)
    fig = _figure(max(4.5, 1.1 * len(labels) + 2.0), 3.4)
    ax = fig.subplots()
    bottom = [0] * len(labels)
    for i, plm in enumerate(plms):
        heights = [int(counts[label].get(plm, 0)) for label in labels]
        ax.bar(labels, heights, bottom=bottom, color=_colour(i), label=plm)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set(ylabel="synthetic samples", title="Label balance")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def plot_work(rounds: Sequence[Mapping[str, Any]], plms: Sequence[str], path: Path) -> Path:
    """Where the work went: per round and PLM, samples (left) and tokens (right) generated, with the
    part kept solid and the part thrown away (rejects, regenerated) pale."""
    fig = _figure(9.0, 3.4)
    xs = [int(r["round"]) for r in rounds]
    width = 0.8 / max(len(plms), 1)
    panels = (("generated", "kept", "samples"), ("tokens", "kept_tokens", "tokens"))
    for ax, (made, kept, unit) in zip(fig.subplots(1, 2), panels, strict=True):
        for i, plm in enumerate(plms):
            offsets = [x - 0.4 + width * (i + 0.5) for x in xs]
            total = [int((r.get(made) or {}).get(plm, 0)) for r in rounds]
            used = [int((r.get(kept) or {}).get(plm, 0)) for r in rounds]
            ax.bar(offsets, total, width=width, color=_colour(i), alpha=0.3)
            ax.bar(offsets, used, width=width, color=_colour(i), label=f"{plm} (kept)")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set(xlabel="round", ylabel=unit, title=f"{unit.capitalize()} generated (pale) and kept")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3, axis="y")
    fig.axes[0].legend(fontsize="small")
    return _save(fig, path)


def work_section(rounds: list[dict[str, Any]], plms: list[str], png: str) -> str:
    """The report's section on where the work went: the figure and a total per PLM."""
    if not any("generated" in r for r in rounds):
        return ""  # a run from before the counts existed
    rows: list[list[Any]] = []
    for plm in plms:
        made, kept, tokens, kept_tokens = (
            sum(int((r.get(key) or {}).get(plm, 0)) for r in rounds)
            for key in ("generated", "kept", "tokens", "kept_tokens")
        )
        rows.append([plm, made, kept, f"{100 * kept / made:.0f} %" if made else "-", tokens, kept_tokens])
    head = ["PLM", "samples generated", "kept", "kept share", "tokens generated", "tokens kept"]
    return (
        '<section id="work"><h2>Where the work went</h2><p>Samples and tokens each PLM generated, and '
        "the part that the checks kept (a rejected sample is regenerated, never copied).</p>"
        f'<img src="{png}" alt="samples and tokens generated and kept per round and PLM" width="990">'
        f"{table(head, rows)}</section>"
    )


def plot_fid(fid_by_round: Mapping[int, float], path: Path) -> Path:
    """FID of the synthetic set accumulated up to each round against the private set."""
    fig = _figure(5.0, 3.2)
    ax = fig.subplots()
    xs = sorted(fid_by_round)
    ax.plot(xs, [fid_by_round[x] for x in xs], marker="o", color="#b00020")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set(xlabel="round (cumulative set)", ylabel="FID", title="FID vs private set (operator only)")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_utility(check: UtilityFigures, path: Path) -> Path:
    """The utility check: each task model's macro-F1 on the private records, with its interval."""
    fig = _figure(5.6, 2.6)
    ax = fig.subplots()
    names = [s.name for s in check.sets]
    estimates = [s.macro_f1.estimate for s in check.sets]
    below = [s.macro_f1.estimate - s.macro_f1.low for s in check.sets]
    above = [s.macro_f1.high - s.macro_f1.estimate for s in check.sets]
    ys = list(range(len(names)))[::-1]
    ax.errorbar(estimates, ys, xerr=[below, above], fmt="o", capsize=4, color=_colour(0))
    ax.set_yticks(ys, names)
    ax.set(xlabel=f"macro-F1 on the private records ({check.confidence:.0%} interval)", xlim=(0, 1))
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


# ----- HTML building blocks ------------------------------------------------------------------------

CSS = """
body { margin: 0; background: #f6f7f9; color: #1d2330; font: 15px/1.5 system-ui, -apple-system,
  "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; }
h1 { font-size: 1.6em; margin: 0 0 12px; } h2 { margin: 36px 0 10px; padding-bottom: 4px;
  border-bottom: 2px solid #e3e6eb; font-size: 1.25em; } h3 { font-size: 1.05em; margin: 20px 0 6px; }
.facts { display: flex; flex-wrap: wrap; gap: 6px 28px; margin: 0; }
.facts dt { font-size: .78em; text-transform: uppercase; letter-spacing: .04em; color: #5d6575; }
.facts dd { margin: 0; font-weight: 600; }
.banner { margin: 18px 0; padding: 12px 16px; border-radius: 6px; border: 1px solid; }
.banner.ok { background: #eef8f0; border-color: #8cc79a; }
.banner.operator, .banner.void { background: #fdecee; border-color: #c62828; color: #7f0d16; }
.banner.operator { border-width: 3px; font-size: 1.05em; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0 16px; }
.card { flex: 1 1 150px; padding: 10px 14px; border: 1px solid #d7dce3; border-radius: 8px; }
.card .k { font-size: .8em; color: #5d6575; } .card .v { font-size: 1.45em; font-weight: 650; }
.card.void .v { color: #c62828; text-decoration: line-through; }
table { border-collapse: collapse; margin: 10px 0 14px; font-size: .92em; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e3e6eb; text-align: left; vertical-align: top; }
table.defs th { background: none; font-weight: 500; color: #4b5563; }
th { background: #f0f2f5; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.group td { border-top: 2px solid #c9ced6; }
tr.total td { font-weight: 650; border-top: 2px solid #9aa1ad; }
img { display: block; max-width: 100%; height: auto; margin: 10px 0; }
.samples { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 12px; }
.sample-box { border: 1px solid #d7dce3; border-radius: 8px; padding: 8px 12px; }
.sample-box h4 { margin: 0 0 6px; font-size: .9em; color: #374151; }
blockquote { margin: 6px 0; padding: 4px 10px; border-left: 3px solid #b8c2d0; white-space: pre-wrap;
  overflow-wrap: anywhere; } .meta { font-size: .78em; color: #6b7280; }
.note { color: #5d6575; } .warn { color: #7f0d16; } section.operator { border: 3px solid #c62828;
  padding: 0 16px 10px; border-radius: 8px; background: #fff7f7; }
footer { margin-top: 40px; font-size: .82em; color: #6b7280; } code { font-size: .92em; }
"""


PUBLIC_BANNER = (
    '<div class="banner ok"><strong>Publishable.</strong> Everything on this page comes from the run\'s '
    "published files (<code>manifest.json</code>, <code>synthetic.parquet</code>); see "
    '<a href="#sharing">what may be shared</a>.</div>'
)
OPERATOR_BANNER = (
    '<div class="banner operator"><strong>OPERATOR ONLY: DO NOT SHARE THIS REPORT.</strong> Its FID section '
    "is computed on the raw private records, outside the differential-privacy accounting.</div>"
)


def fmt(value: Any) -> str:
    """Numbers short and readable (4 significant digits, scientific when tiny); None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3g}" if value != 0 and abs(value) < 1e-3 else f"{value:.4g}"


def _cell(value: Any) -> str:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f'<td class="n">{escape(fmt(value))}</td>' if numeric else f"<td>{escape(str(value))}</td>"


def table(
    head: Sequence[str],
    rows: Iterable[Sequence[Any]],
    last_is_total: bool = False,
    group_starts: frozenset[int] = frozenset(),
) -> str:
    """An HTML table of escaped cells; numbers right-aligned; rows in ``group_starts`` open a group."""
    rows = list(rows)
    out = ["<table><thead><tr>", *(f"<th>{escape(str(h))}</th>" for h in head), "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        cls = "total" if last_is_total and i == len(rows) - 1 else ("group" if i in group_starts else "")
        out.append(f'<tr class="{cls}">' if cls else "<tr>")
        out += [_cell(v) for v in row]
        out.append("</tr>")
    return "".join(out) + "</tbody></table>"


def definition_table(items: Mapping[str, Any]) -> str:
    """Two columns, name and value, for settings and facts (keys like ``max_records`` read as words)."""
    rows = "".join(
        f"<tr><th>{escape(str(k).replace('_', ' '))}</th><td>{escape(fmt(v))}</td></tr>"
        for k, v in items.items()
    )
    return f'<table class="defs"><tbody>{rows}</tbody></table>'


def cards(items: Mapping[str, str], void: Iterable[str] = ()) -> str:
    """Headline figures, one card each; those named in ``void`` struck through in red."""
    void = set(void)
    body = "".join(
        f'<div class="card{" void" if k in void else ""}"><div class="k">{escape(k)}</div>'
        f'<div class="v">{escape(v)}</div></div>'
        for k, v in items.items()
    )
    return f'<div class="cards">{body}</div>'


def rounds_table(rounds: list[dict[str, Any]], plms: list[str]) -> str:
    """One row per round and PLM; a rejected column when the run counted rejects (runs older than the
    quality gate counted none)."""
    gated = any("rejects" in r for r in rounds)
    head = ["round", "PLM", "quota", "kept", "shortfall", "weight before", "weight after", "tokens",
            "seconds", "engine failures", *(["rejected"] if gated else []), "missing (round)"]  # fmt: skip
    rows: list[list[Any]] = []
    starts: set[int] = set()
    for record in rounds:
        starts.add(len(rows))
        for i, plm in enumerate(plms):
            row = [
                record.get("round"),
                plm,
                *(_get(record, key, plm) for key in ("quotas", "kept", "shortfall")),
            ]
            row += [_at(record.get("weights_before"), i), _at(record.get("weights_after"), i)]
            row += [_get(record, key, plm) for key in ("tokens", "seconds", "engine_failures")]
            if gated:
                row.append(sum((record.get("rejects") or {}).get(plm, {}).values()))
            rows.append([*row, record.get("missing", 0) if i == 0 else ""])
    return table(head, rows, group_starts=frozenset(starts))


def _get(record: dict[str, Any], key: str, plm: str) -> Any:
    value = record.get(key)
    return value.get(plm, 0) if isinstance(value, dict) else value


def _at(values: Any, i: int) -> Any:
    return values[i] if isinstance(values, list) and i < len(values) else None


def sharing_section(operator: bool) -> str:
    """Which files of the run may be published, and that ``private/`` (and an operator's report) may not."""
    if operator:
        return (
            '<section id="sharing"><h2>What may be shared</h2><p class="warn">'
            "<strong>Not this report.</strong> It holds the operator's FID against the raw private "
            "records. Share a report made without <code>--private</code> instead, with "
            "<code>synthetic.parquet</code> and <code>manifest.json</code>. Never share the run's "
            "<code>private/</code> folder.</p></section>"
        )
    return (
        '<section id="sharing"><h2>What may be shared</h2><table><tbody>'
        "<tr><td><strong>publish</strong></td><td><code>synthetic.parquet</code>, "
        "<code>manifest.json</code>, the card <code>README.md</code> (<code>wasp-vllm publish</code> "
        "gathers the three), and this report (<code>index.html</code> with its PNGs): functions "
        "of the noisy votes and public settings only</td></tr>"
        "<tr><td><strong>never share</strong></td><td>the run's <code>private/</code> folder "
        "(<code>noise.key</code>, <code>state.json</code>, <code>rounds/</code>), <code>-v</code> logs, "
        "and any report made with <code>--private</code></td></tr></tbody></table></section>"
    )

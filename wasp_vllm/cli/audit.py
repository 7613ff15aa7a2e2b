"""``wasp-vllm audit``: an empirical privacy audit of the user's own settings, from one real run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from wasp_vllm.cli.app import app, console, friendly_errors, setup_logging
from wasp_vllm.cli.options import settings_command
from wasp_vllm.config import RunConfig
from wasp_vllm.ops.audit import CanaryDesign

DESIGN = CanaryDesign()  # the audit's defaults, written once (in CanaryDesign)
#: The settings an audit is asked about on the command line: the run it makes (what, the private
#: data, the guarantee under audit, where it runs).  Every other setting of ``generate`` comes from
#: --config, so a run file audits exactly the run it describes.
AUDIT_SETTINGS = (
    "plms", "task", "n", "rounds", "strategy", "q", "s",
    "private", "private_limit", "text_col", "label_col", "attribute_col", "user_col",
    "epsilon", "delta", "accountant", "neighbour", "privacy_unit", "max_records_per_user",
    "engine", "embedder", "max_new_tokens", "seed",
)  # fmt: skip


@app.command()
@settings_command(RunConfig, AUDIT_SETTINGS)
def audit(
    settings: dict[str, Any],
    config: Annotated[
        Path | None, typer.Option(help="A TOML/YAML file of these settings; flags override it.")
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Folder of the audit's run (its coins and result stay in private/).")
    ] = Path("runs/audit"),
    canaries: Annotated[
        int | None,
        typer.Option(
            help="Canary records, each put in the data by a secret fair coin (default: the fewest "
            "that can refute the claimed epsilon, e.g. 373 at epsilon 4).",
            show_default=False,
        ),
    ] = DESIGN.canaries,
    out_guesses: Annotated[
        int,
        typer.Option(help="Also guess 'out' for this many of the canaries that echo least (default: none)."),
    ] = DESIGN.out_guesses,
    confidence: Annotated[float, typer.Option(help="Confidence of the lower bound.")] = DESIGN.confidence,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run already in --out.")] = False,
    allow_weak: Annotated[
        bool, typer.Option("--allow-weak", help="Run an audit that cannot refute the claim (warns loudly).")
    ] = False,
) -> None:
    """Audit these settings: a lower bound on the epsilon a real run of them has, beside its claim.

    Canaries go into the private data, one real run is made, and a membership attack reads the
    published text only. A bound above the claim proves a leak; a bound below it does not prove the
    claim. An audit that could not refute the claim even with a perfect attack is refused
    (--allow-weak). The audit's run spends privacy on the canaries: publish a separate run.
    Settings not shown here come from --config."""
    setup_logging(False)
    with friendly_errors():
        from wasp_vllm.ops.audit import audit as run_audit

        # (its run's engines print into out/private/engines.log: engines.chatter)
        result = run_audit(
            out=out, design=CanaryDesign(canaries, out_guesses, confidence), config=config,
            overwrite=overwrite, allow_weak=allow_weak, **settings,
        )  # fmt: skip
        console.print(result.statement(), markup=False)
        if result.refutes_claim:
            raise typer.Exit(3)

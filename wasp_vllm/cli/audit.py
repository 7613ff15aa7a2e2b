"""``wasp-vllm audit``: an empirical privacy audit of the user's own settings, from one real run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from wasp_vllm.cli.app import app, chatter_to_file, console, friendly_errors, setup_logging
from wasp_vllm.cli.options import config_command
from wasp_vllm.ops.audit import CanaryDesign

DESIGN = CanaryDesign()  # the audit's defaults, written once (in CanaryDesign)


@app.command()
@config_command
def audit(
    settings: dict[str, Any],
    config: Annotated[
        Path | None, typer.Option(help="A TOML/YAML file of these settings; flags override it.")
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Folder of the audit's run (its coins and result stay in private/).")
    ] = Path("runs/audit"),
    canaries: Annotated[
        int, typer.Option(help="Canary records, each put in the data by a secret fair coin (64+ for power).")
    ] = DESIGN.canaries,
    out_guesses: Annotated[
        int,
        typer.Option(help="Also guess 'out' for this many of the canaries that echo least (default: none)."),
    ] = DESIGN.out_guesses,
    confidence: Annotated[float, typer.Option(help="Confidence of the lower bound.")] = DESIGN.confidence,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run already in --out.")] = False,
) -> None:
    """Audit these settings: canaries in the private data, one real run, a membership attack on
    the published text only, and a lower bound on the epsilon the run really has, beside the one it
    claims. A bound above the claim proves a leak; a bound below it does not prove the claim. The
    audit's run spends privacy on the canaries: publish a separate run."""
    setup_logging(False)
    with friendly_errors():
        from wasp_vllm.ops.audit import audit as run_audit

        with chatter_to_file(False, out):
            result = run_audit(
                out=out, design=CanaryDesign(canaries, out_guesses, confidence), config=config,
                overwrite=overwrite, **settings,
            )  # fmt: skip
        console.print(result.statement(), markup=False)
        if result.refutes_claim:
            raise typer.Exit(3)

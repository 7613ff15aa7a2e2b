"""``wasp-vllm fleet up | status | down``: PLMs served on a Ray cluster (Ray Serve LLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from wasp_vllm.cli.app import app, console, friendly_errors, setup_logging

fleet_app = typer.Typer(
    name="fleet",
    help="Serve PLMs on a Ray cluster (Ray Serve): deploy a fleet file's PLMs, check them, remove them "
    "(launch/README.md). Start the cluster first with `ray start --head`.",
    no_args_is_help=True,
)
app.add_typer(fleet_app)
FleetDir = Annotated[
    Path,
    typer.Option("--dir", help="Where `fleet up` records the deployment: fleet.json, plms.txt, run.yaml."),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        help="The Ray cluster: auto (the one `ray start --head` runs here, or $RAY_ADDRESS), HOST:6379 or "
        "ray://HOST:10001. Default: `up` takes the fleet file's [ray] address; status and down the one up "
        "used.",
    ),
]
DEFAULT_FLEET_DIR = Path("launch/fleet-state")


def _fleet_error(exc: Exception) -> typer.Exit:
    """A fleet error may list each deployment's message: printed as is (several lines); exit code 1."""
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    return typer.Exit(1)


@fleet_app.command("up")
def fleet_up(
    fleet_file: Annotated[Path, typer.Argument(help="Fleet file (TOML), e.g. launch/fleet.example.toml.")],
    directory: FleetDir = DEFAULT_FLEET_DIR,
    ray_address: RayAddress = None,
    wait: Annotated[
        float | None, typer.Option(help="Seconds to wait until every PLM runs (default: the file's wait_s).")
    ] = None,
) -> None:
    """Deploy each PLM of the fleet file to Ray Serve, wait until all run, print the --plms value."""
    setup_logging(False)
    from wasp_vllm.ops import fleet, ray_fleet

    with friendly_errors():
        try:
            plms = ray_fleet.up(fleet.read_fleet(fleet_file), directory, address=ray_address, wait_s=wait)
        except fleet.FleetError as exc:
            raise _fleet_error(exc) from None
        console.print(
            f"fleet up: the PLMs run on Ray Serve; state in {directory}. Generate with\n"
            f"  wasp-vllm generate --plms '{plms}' ...\n"
            f"or with the run file {directory}/run.yaml (--config).\n"
            f"Remove them with: wasp-vllm fleet down --dir {directory}",
            highlight=False,
            soft_wrap=True,
        )
        typer.echo(plms)  # stdout: the --plms value alone, for scripts


@fleet_app.command("status")
def fleet_status(
    directory: FleetDir = DEFAULT_FLEET_DIR,
    ray_address: RayAddress = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list instead of a table.")] = False,
) -> None:
    """Each PLM's deployment as Ray Serve reports it; exit code 1 unless every one is HEALTHY."""
    setup_logging(False)
    from wasp_vllm.ops import fleet, ray_fleet

    try:
        rows = ray_fleet.status(directory, ray_address)
    except fleet.FleetError as exc:
        raise _fleet_error(exc) from None
    cols = ("deployment", "status", "replicas", "message")
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
    else:
        table = Table(title=f"fleet recorded in {directory}")
        for col in cols:
            table.add_column(col)
        for r in rows:
            table.add_row(*(str(r[c]) for c in cols))
        Console().print(table if rows else f"no fleet recorded in {directory}")
    if not rows or not all(r["status"] == "HEALTHY" for r in rows):
        raise typer.Exit(1)


@fleet_app.command("down")
def fleet_down(directory: FleetDir = DEFAULT_FLEET_DIR, ray_address: RayAddress = None) -> None:
    """Delete the application `fleet up` deployed (serve.delete); the Ray cluster keeps running."""
    setup_logging(False)
    from wasp_vllm.ops import fleet, ray_fleet

    try:
        name = ray_fleet.down(directory, ray_address)
    except fleet.FleetError as exc:
        raise _fleet_error(exc) from None
    console.print(f"deleted Ray Serve application {name!r}" if name else f"no fleet recorded in {directory}")

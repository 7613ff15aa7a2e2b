"""``wasp-vllm publish RUN DIR``: the shareable files of a run and its card, in a folder (and on a hub)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from wasp_vllm.cli.app import app, console, friendly_errors, setup_logging


@app.command()
def publish(
    run_dir: Annotated[Path, typer.Argument(help="A finished run (the --out folder of `generate`).")],
    dest: Annotated[
        Path, typer.Argument(help="Folder to write: synthetic.parquet, manifest.json and the card README.md.")
    ],
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace what DEST holds (it is replaced whole, at once).")
    ] = False,
    allow_void_epsilon: Annotated[
        bool,
        typer.Option(
            "--allow-void-epsilon",
            help="Publish a run made with --noise-seed, whose epsilon is void (no privacy guarantee).",
        ),
    ] = False,
    license: Annotated[
        str | None,
        typer.Option(help="Licence in the card, a Hugging Face licence id (default: the run's, 'other')."),
    ] = None,
    push_to_hub: Annotated[
        str | None,
        typer.Option(help="Also upload DEST to this Hugging Face data set repo (OWNER/NAME)."),
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(help="Hub to push to (default: HF_ENDPOINT, else huggingface.co); token from HF_TOKEN."),
    ] = None,
    private_repo: Annotated[
        bool, typer.Option("--private-repo", help="Create the hub repo as private (if it does not exist).")
    ] = False,
) -> None:
    """Gather a run's shareable files and its data-set card into DEST; never its private/ folder.

    `datasets.load_dataset(DEST)` then reads it. A run whose epsilon is void is refused unless
    --allow-void-epsilon is given."""
    setup_logging(False)
    with friendly_errors():
        from wasp_vllm.publish import publish_run
        from wasp_vllm.publish import push_to_hub as push

        if license is not None:
            from wasp_vllm.config import build_config

            build_config({}, {"license": license})  # the same check as generate's --license
        files = publish_run(
            run_dir, dest, overwrite=overwrite, allow_void_epsilon=allow_void_epsilon, license=license
        )
        console.print(f"published {', '.join(p.name for p in files)} to {dest}", highlight=False)
        if json.loads((dest / "manifest.json").read_text())["privacy"].get("epsilon_void"):
            console.print(
                "[bold yellow]warning:[/] this data set carries no privacy guarantee", highlight=False
            )
        if push_to_hub is not None:
            url = push(dest, push_to_hub, endpoint=endpoint, private=private_repo)
            console.print(f"pushed to {url}", highlight=False)

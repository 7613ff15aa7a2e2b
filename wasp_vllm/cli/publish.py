"""``wasp-vllm publish RUN DIR``: the shareable files of a run and its card, in a folder (and on a hub)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from wasp_vllm.cli.app import app, console, friendly_errors, setup_logging
from wasp_vllm.cli.options import settings_command
from wasp_vllm.config import build_settings
from wasp_vllm.config.checks import check_writable_folder
from wasp_vllm.privacy.report import PrivacyReport
from wasp_vllm.publish.settings import PublishSettings


@app.command()
@settings_command(PublishSettings)
def publish(
    settings: dict[str, Any],
    run_dir: Annotated[Path, typer.Argument(help="A finished run (the --out folder of `generate`).")],
    dest: Annotated[
        Path, typer.Argument(help="Folder to write: synthetic.parquet, manifest.json and the card README.md.")
    ],
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace what DEST holds (it is replaced whole, at once).")
    ] = False,
) -> None:
    """Gather a run's shareable files and its data-set card into DEST; never its private/ folder.

    `datasets.load_dataset(DEST)` then reads it. A run whose epsilon is void is refused unless
    --allow-void-epsilon is given."""
    setup_logging(False)
    with friendly_errors():
        from wasp_vllm.publish import publish_run
        from wasp_vllm.publish import push_to_hub as push

        chosen = build_settings(PublishSettings, settings)
        check_writable_folder(dest, "DEST")  # before anything is staged beside it
        files = publish_run(
            run_dir, dest, overwrite=overwrite, allow_void_epsilon=chosen.allow_void_epsilon,
            license=chosen.license,
        )  # fmt: skip
        console.print(f"published {', '.join(p.name for p in files)} to {dest}", highlight=False)
        published = json.loads((dest / "manifest.json").read_text())["privacy"]
        if PrivacyReport.from_json(published).epsilon_void:
            console.print(
                "[bold yellow]warning:[/] this data set carries no privacy guarantee", highlight=False
            )
        if chosen.push_to_hub is not None:
            url = push(dest, chosen.push_to_hub, endpoint=chosen.endpoint, private=chosen.private_repo)
            console.print(f"pushed to {url}", highlight=False)

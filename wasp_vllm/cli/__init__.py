"""The ``wasp-vllm`` command line: ``generate`` (in :mod:`.app`) and the other commands."""

from wasp_vllm.cli import commands as _commands  # noqa: F401 - registers the other commands
from wasp_vllm.cli.app import app

__all__ = ["app"]

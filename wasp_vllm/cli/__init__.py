"""The ``wasp-vllm`` command line: ``generate`` (in :mod:`.app`) and the other commands."""

from wasp_vllm.cli import audit as _audit  # noqa: F401 - registers `audit`
from wasp_vllm.cli import commands as _commands  # noqa: F401 - registers the other commands
from wasp_vllm.cli import fleet as _fleet  # noqa: F401 - registers `fleet`
from wasp_vllm.cli import models as _models  # noqa: F401 - registers `models`
from wasp_vllm.cli import publish as _publish  # noqa: F401 - registers `publish`
from wasp_vllm.cli.app import app

__all__ = ["app"]

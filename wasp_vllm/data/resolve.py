"""What a ``--private`` or ``--test`` value names: a file, a built-in public set (``NAME`` or
``NAME:SPLIT``), or data handed over in memory; and the table it names.

Above both :mod:`wasp_vllm.data.sources` (files) and :mod:`wasp_vllm.data.builtin` (the built-in
sets, which read their packaged files through ``sources``), so neither imports the other back.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from wasp_vllm.data.builtin import BUILTIN, Builtin, builtin_split
from wasp_vllm.data.sources import read_table

#: How a run's settings name private data handed over in memory (the Python API): published as
#: it is, where a file's path is published only as a keyed fingerprint.
IN_MEMORY = "<in-memory>"


def builtin_name(source: str) -> str | None:
    """The built-in set ``source`` names (``NAME`` or ``NAME:SPLIT``), or None for a file: a file at
    that path wins over a built-in of the same name."""
    name = source.partition(":")[0]
    return name if name in BUILTIN and not Path(source).exists() else None


def source_table(source: str, split: str) -> tuple[pa.Table, Builtin | None]:
    """The table for a file path or a built-in name (``NAME`` or ``NAME:SPLIT``, e.g.
    ``drugs:validation``), plus the built-in's column mapping if any."""
    if (name := builtin_name(source)) is not None:
        return builtin_split(name, source.partition(":")[2] or split), BUILTIN[name]
    return read_table(source), None

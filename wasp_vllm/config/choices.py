"""The choices that settings name and the privacy code acts on, each one enum (the bottom layer:
:mod:`wasp_vllm.privacy` imports them from here, never the other way round)."""

from __future__ import annotations

from enum import StrEnum


class Neighbour(StrEnum):
    """How two neighbouring data sets differ: one unit more or less, or one unit changed."""

    ADD_REMOVE = "add_remove"
    REPLACE = "replace"


class AccountantMode(StrEnum):
    """Which accountant chooses sigma (the exact one checks every run either way)."""

    EXACT = "exact"
    PAPER = "paper"

"""Experimental round policies: how a variant of WASP is tried without a new option.

A policy implements ``wasp_vllm.pipeline.policy.RoundPolicy`` (the next round's pools from the noisy
votes, the PLM weights, whether a freshly written sample is kept); it sees only public values, so
whatever it returns is post-processing of what was released.  Register one here by name and the
tasks grid measures it as the method ``policy-NAME`` against WASP (``quality_tasks.py --methods
wasp,policy-NAME``); the harness hands it to the run (``Run(..., policy=...)``), never through
``RunConfig``, and keys the run's record by its name.  A variant becomes an option of the product
only after the adoption rule (``lever_rule.py``, docs/quality.md) adopts it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: name -> (label in the tables, a factory of the policy).  Empty: every experiment measured so far
#: was decided (docs/levers-not-adopted.md); add one here to try the next.
POLICIES: dict[str, tuple[str, Callable[[], Any]]] = {}


def policy_of(name: str) -> Any:
    """A fresh instance of the registered policy ``name``; KeyError names the registered ones."""
    if name not in POLICIES:
        raise KeyError(
            f"no experimental policy {name!r}; registered: {', '.join(sorted(POLICIES)) or 'none'}"
        )
    return POLICIES[name][1]()

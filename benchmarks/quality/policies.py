"""Experimental round policies: how a variant of WASP is tried without a new option.

A policy implements ``wasp_vllm.pipeline.policy.RoundPolicy`` (the next round's pools from the noisy
votes, the PLM weights, whether a freshly written sample is kept, after which rounds the records
vote); it sees only public values, so whatever it returns is post-processing of what was released.
Register one in :data:`POLICIES` and the grid measures it as the method ``policy-NAME`` against
WASP (``python -m benchmarks.quality.grid --methods wasp,policy-NAME``): the harness hands the run a
fresh instance (``wasp_vllm.generate(..., policy=...)``), never a ``RunConfig`` setting, and keys the
run's record by its name.  A variant becomes an option of the product only after the adoption rule
(``lever_rule.py``; docs/quality.md) adopts it.

Every policy measured so far was rejected by the rule, and its code left at its verdict; the
figures stay in docs/research/levers-not-adopted.md.  Restore one with
``git show 84b2c1c:benchmarks/quality/policies.py`` (signal-switch, diverse-pools, wide-pools,
diversity-guard, first-round-pools, no-close-copies, strong-votes; written for that commit's
script layout, ``import round_stats``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: name -> (label in the tables, a factory of the policy): the candidates under trial now.
POLICIES: dict[str, tuple[str, Callable[[], Any]]] = {}


def policy_of(name: str) -> Any:
    """A fresh instance of the registered policy ``name``; KeyError names the registered ones."""
    if name not in POLICIES:
        raise KeyError(
            f"no experimental policy {name!r}; registered: {', '.join(sorted(POLICIES)) or 'none'}"
        )
    return POLICIES[name][1]()

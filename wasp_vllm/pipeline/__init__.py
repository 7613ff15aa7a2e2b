"""The round loop of WASP and of the baselines that share it.

``prepare(cfg)`` loads the task and the private data and fixes the privacy plan; ``Run(ctx, out,
engine_factory=..., embedder=...).execute()`` runs the rounds and writes the output directory.
Where each step lives: ``context`` (before the first round), ``prompts`` (one PLM's prompts and the
cleaning of its samples), ``generation`` (a round's shares, retries, failover), ``loop`` (the
rounds), ``state`` (what is checkpointed), ``manifest`` (what is published), ``backends`` (real
engines and embedder).
"""

from wasp_vllm.pipeline.backends import Backends, Collaborators, EngineFactory, default_backends
from wasp_vllm.pipeline.context import RunContext, per_round_totals, prepare, privacy_plan
from wasp_vllm.pipeline.generation import PipelineError
from wasp_vllm.pipeline.loop import Run

__all__ = [
    "Backends",
    "Collaborators",
    "EngineFactory",
    "PipelineError",
    "Run",
    "RunContext",
    "default_backends",
    "per_round_totals",
    "prepare",
    "privacy_plan",
]

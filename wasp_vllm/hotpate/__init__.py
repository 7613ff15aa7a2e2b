"""Hot PATE: differentially private aggregation of next-token distributions (Cohen et al.).

Teachers are prompts built from disjoint parts of the private data; a coordinated ensemble
(one shared ``Exp(1)`` draw per token) turns their distributions into a sharp vote histogram;
a private step (a Gaussian release on a ledger, or a target-charged stable argmax) picks the next
public token.  See the submodules: ``teachers`` (transformers, KV-cache reuse) and
``vllm_teachers`` (vLLM, top-K with a "no token" bin), ``ensembles``, ``aggregators``,
``accounting`` (target charging), ``steps`` (the two accountings), ``selector`` (one token),
``settings``, ``prompts``, ``generate`` (the run) and ``report`` (the manifest entry).
"""

from wasp_vllm.hotpate.aggregators import (
    VOTE_SENSITIVITY,
    AggregationResult,
    Aggregator,
    HeterogeneousAggregator,
    HomogeneousAggregator,
    make_aggregator,
    noise_margin,
    noisy_histogram,
)
from wasp_vllm.hotpate.ensembles import (
    PreparedEnsemble,
    VoteHistogram,
    coordinated_votes,
    draw_votes,
    independent_votes,
    vote_histogram,
)
from wasp_vllm.hotpate.generate import TeacherModel, generate_hotpate, run_hotpate
from wasp_vllm.hotpate.prompts import build_teacher_prompts
from wasp_vllm.hotpate.selector import (
    PrivateTokenSelector,
    RecordOutcome,
    TokenDecision,
    generate_record,
    sample_public,
)
from wasp_vllm.hotpate.settings import HotPateSettings
from wasp_vllm.hotpate.steps import ChargedStep, GaussianStep, PrivateStep, label_budget, vote_sensitivity
from wasp_vllm.hotpate.teachers import DistributionSource, LoadedLM, TeacherEnsembleLM, load_lm

__all__ = [
    "VOTE_SENSITIVITY",
    "AggregationResult",
    "Aggregator",
    "ChargedStep",
    "DistributionSource",
    "GaussianStep",
    "HeterogeneousAggregator",
    "HomogeneousAggregator",
    "HotPateSettings",
    "LoadedLM",
    "PreparedEnsemble",
    "PrivateStep",
    "PrivateTokenSelector",
    "RecordOutcome",
    "TeacherEnsembleLM",
    "TeacherModel",
    "TokenDecision",
    "VoteHistogram",
    "build_teacher_prompts",
    "coordinated_votes",
    "draw_votes",
    "generate_hotpate",
    "generate_record",
    "independent_votes",
    "label_budget",
    "load_lm",
    "make_aggregator",
    "noise_margin",
    "noisy_histogram",
    "run_hotpate",
    "sample_public",
    "vote_histogram",
    "vote_sensitivity",
]

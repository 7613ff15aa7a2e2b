"""Hot PATE: differentially private aggregation of next-token distributions (Cohen et al.).

Teachers are prompts built from disjoint parts of the private data; a coordinated ensemble
(one shared ``Exp(1)`` draw per token) turns their distributions into a sharp vote histogram;
a Gaussian release of that histogram picks the next public token.  See the submodules:
``teachers`` (batched next-token distributions with KV-cache reuse), ``ensembles``,
``aggregators`` and ``generate`` (the token loop, the privacy ledger, synthetic records).
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
from wasp_vllm.hotpate.generate import HotPateSettings, build_teacher_prompts, generate_hotpate, run_hotpate
from wasp_vllm.hotpate.selector import (
    PrivateTokenSelector,
    RecordOutcome,
    TokenDecision,
    generate_record,
    sample_public,
    vote_sensitivity,
)
from wasp_vllm.hotpate.teachers import DistributionSource, LoadedLM, TeacherEnsembleLM, load_lm

__all__ = [
    "VOTE_SENSITIVITY",
    "AggregationResult",
    "Aggregator",
    "DistributionSource",
    "HeterogeneousAggregator",
    "HomogeneousAggregator",
    "HotPateSettings",
    "LoadedLM",
    "PreparedEnsemble",
    "PrivateTokenSelector",
    "RecordOutcome",
    "TeacherEnsembleLM",
    "TokenDecision",
    "VoteHistogram",
    "build_teacher_prompts",
    "coordinated_votes",
    "draw_votes",
    "generate_hotpate",
    "generate_record",
    "independent_votes",
    "load_lm",
    "make_aggregator",
    "noise_margin",
    "noisy_histogram",
    "run_hotpate",
    "sample_public",
    "vote_histogram",
    "vote_sensitivity",
]

"""A run's plan before it runs (``generate --dry-run``): its privacy releases, its quotas, the tokens
it will generate and the wall time it will take per engine, from settings and public facts only.

Nothing here reads the private data (not even its size) or loads a model: sigma comes from the
privacy plan (settings only), quotas from N, T and the PLMs, speeds and start-ups from
:mod:`wasp_vllm.pipeline.throughput` (the last run's measurement here, else a built-in table, and
it says which), rejects and sample lengths from public figures (never an earlier run's: they
follow its noisy votes, and the plan is published).  After a real run, :func:`against_run` puts
the estimate beside what happened, in the manifest: all of it public settings and timings of
public work.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from wasp_vllm.config import RunConfig
from wasp_vllm.engines.devices import nvidia_gpus
from wasp_vllm.engines.presets import PACKAGED, PRESETS
from wasp_vllm.engines.registry import ModelError, cache_dir, parse_plm, resolve_plm
from wasp_vllm.pipeline import throughput
from wasp_vllm.pipeline.context import neighbourhood, per_round_totals, privacy_plan
from wasp_vllm.pipeline.selection import allocate_quotas
from wasp_vllm.privacy.accountant import EXACT
from wasp_vllm.privacy.plan import LABEL_PRIOR, UTILITY_CHECK, PrivacyPlan, released_histograms
from wasp_vllm.strategies import get_strategy
from wasp_vllm.tasks import get_task

if TYPE_CHECKING:  # the manifest module builds on this one's neighbours; typing only
    from wasp_vllm.pipeline.manifest import Manifest

#: First use of a packaged model dequantizes it into the cache (about a minute, once).
DEQUANTIZE_S = 60.0


@dataclass(frozen=True)
class Release:
    """One kind of noisy release: how many, its sigma and sensitivity, and the epsilon it spends alone."""

    what: str
    count: int
    sigma: float
    sensitivity: float
    epsilon_alone: float


@dataclass(frozen=True)
class EngineEstimate:
    """One PLM: which engine serves it where, what it writes and how long that should take."""

    plm: str
    engine: str
    device: str
    resolves: str
    samples: int  # kept samples asked of it over the run (at equal weights)
    generated: int  # samples it should generate, rejects included
    tokens: int
    tokens_per_s: float
    startup_s: float
    generation_s: float
    source: str

    @property
    def wall_s(self) -> float:
        return self.startup_s + self.generation_s


@dataclass(frozen=True)
class RunPlan:
    """What a run will release, ask and cost; :meth:`to_dict` is public (settings and public facts)."""

    summary: dict[str, Any]
    guarantee: str
    releases: list[Release]
    epsilon_exact: float
    quotas: list[dict[str, int]]
    quotas_final: bool  # False: later rounds follow the noisy weights (shown at equal weights)
    labels: str
    engines: list[EngineEstimate]
    concurrent: bool
    overhead_s: float
    dequantize_s: float

    @property
    def total_s(self) -> float:
        """Start-ups one after the other, generation side by side when concurrent, plus the rest."""
        generation = [e.generation_s for e in self.engines]
        together = max(generation, default=0.0) if self.concurrent else sum(generation)
        startups = sum(e.startup_s for e in self.engines)
        return startups + together + self.overhead_s + self.dequantize_s

    @property
    def tokens(self) -> int:
        return sum(e.tokens for e in self.engines)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["engines"] = [asdict(e) | {"wall_s": round(e.wall_s, 1)} for e in self.engines]
        return data | {"total_s": round(self.total_s, 1), "tokens": self.tokens}


def device_here() -> str:
    """'gpu' when nvidia-smi lists one (and ``WASP_VLLM_DEVICE`` does not force the CPU), else 'cpu'."""
    if os.environ.get("WASP_VLLM_DEVICE", "").lower() == "cpu":
        return "cpu"
    return "gpu" if nvidia_gpus() else "cpu"


def plan_run(cfg: RunConfig, privacy: PrivacyPlan | None = None) -> RunPlan:
    """The plan of a run with these settings (reads no private data, loads no model). ``privacy``:
    the run's privacy plan where it is already made (a run's context holds it: sigma is
    calibrated once per run), else the paper's policy's, made here."""
    task, device = get_task(cfg.task), device_here()
    privacy = privacy or privacy_plan(cfg)
    quotas, final = planned_quotas(cfg)
    cap = cfg.max_new_tokens or task.max_new_tokens
    engines = [_engine_estimate(spec, cfg, device, sum(q[spec] for q in quotas), cap) for spec in cfg.plms]
    labels = f"even over the {len(task.labels)} labels"
    if cfg.label_prior == "private":
        labels = "per label: from the noisy histogram of the private labels (known once it is released)"
    return RunPlan(
        summary={
            "strategy": cfg.strategy,
            "task": task.name,
            "n": cfg.n,
            "rounds": cfg.rounds,
            "plms": list(cfg.plms),
            "device": device,
            "max_new_tokens": cap,
        },  # fmt: skip
        guarantee=_guarantee(cfg),
        releases=_releases(privacy, cfg.delta),
        epsilon_exact=round(privacy.epsilon_exact_spent, 6),
        quotas=quotas,
        quotas_final=final,
        labels=labels,
        engines=engines,
        concurrent=cfg.engine_args.side_by_side(gpu=device == "gpu"),
        overhead_s=throughput.OVERHEAD_S + throughput.OVERHEAD_S_PER_SAMPLE * cfg.n,
        dequantize_s=DEQUANTIZE_S * sum(_needs_dequantizing(spec) for spec in cfg.plms),
    )


def _guarantee(cfg: RunConfig) -> str:
    where = neighbourhood(cfg)
    change = "added or removed" if cfg.neighbour == "add_remove" else "changed"
    return (
        f"({cfg.epsilon:g}, {cfg.delta:g})-DP for one {where.unit} {change} in the file passed with "
        f"--private; the records that vote: {where.selection}"
    )


def _releases(plan: PrivacyPlan, delta: float) -> list[Release]:
    """Each kind of release the plan pays for, in the order the run makes them."""
    names = {LABEL_PRIOR: "label histogram", "votes": f"votes ({released_histograms(plan.histograms)})",
             UTILITY_CHECK: "utility check (noisy confusion matrices)"}  # fmt: skip
    out = []
    for what, name in names.items():
        group = [r for r in plan.planned_releases() if r.what == what]
        if group:
            alone = round(EXACT.epsilon(group, delta), 4)
            out.append(Release(name, len(group), group[0].sigma, group[0].sensitivity, alone))
    return out


def planned_quotas(cfg: RunConfig) -> tuple[list[dict[str, int]], bool]:
    """Samples asked of each PLM per round at equal weights, and whether they stay so (no re-weighting)."""
    shares = np.full(len(cfg.plms), 1.0 / len(cfg.plms))
    rounds = [
        dict(zip(cfg.plms, allocate_quotas(int(total), shares, cfg.min_plm_share).tolist(), strict=True))
        for total in per_round_totals(cfg.n, cfg.rounds)
    ]
    strategy = get_strategy(cfg.strategy)
    return rounds, not (strategy.reweights and strategy.votes and cfg.rounds > 1)


def engine_for(spec: str, cfg: RunConfig) -> str:
    """The engine a run would give this PLM (``--engine auto``: vLLM where installed and it can)."""
    model, urls = parse_plm(spec)
    if urls is not None or cfg.engine == "openai":
        return "openai"
    if cfg.engine != "auto":
        return cfg.engine
    preset = PRESETS.get(model)
    if (preset is not None and preset.seq2seq) or importlib.util.find_spec("vllm") is None:
        return "hf"
    return "vllm"


def resolves_here(spec: str) -> str:
    """'yes', 'packaged', 'served', or 'no: how to get it' (local look-ups only, nothing loaded)."""
    model, urls = parse_plm(spec)
    if urls is not None:
        return "served"
    preset = PRESETS.get(model)
    if preset is not None and preset.group == PACKAGED:
        return "packaged"
    try:
        resolve_plm(model)
    except ModelError as exc:
        return f"no: {exc}"
    return "yes"


def _needs_dequantizing(spec: str) -> bool:
    from wasp_vllm.engines.registry import _DEQUANT_VERSION

    preset = PRESETS.get(parse_plm(spec)[0])
    if preset is None or preset.packaged is None:
        return False
    return not (cache_dir() / "models" / f"{preset.packaged}-v{_DEQUANT_VERSION}" / "config.json").is_file()


def _engine_estimate(spec: str, cfg: RunConfig, device: str, samples: int, cap: int) -> EngineEstimate:
    engine = engine_for(spec, cfg)
    speed = throughput.lookup(spec, engine, device)
    # Per-sample facts are public figures, never an earlier run's (they follow its noisy votes).
    regen = throughput.REGENERATION["label_check" if cfg.label_check == "drop" else "none"]
    generated = int(round(samples * regen))
    tokens = generated * cap  # the token cap: the worst case
    return EngineEstimate(spec, engine, device, resolves_here(spec), samples, generated, tokens,
                          speed.tokens_per_s, speed.startup_s, tokens / speed.tokens_per_s,
                          speed.source)  # fmt: skip


#: Engine classes by the name the estimate and the throughput records use.
ENGINE_KINDS = {"VLLMEngine": "vllm", "HFEngine": "hf", "OpenAIEngine": "openai"}


def engine_kind(engine: object) -> str:
    """'vllm', 'hf' or 'openai' for the real engines; another engine's class name (a test double's)."""
    name = type(engine).__name__
    return ENGINE_KINDS.get(name, name)


def against_run(plan: RunPlan, manifest: Manifest, engines: dict[str, str]) -> dict[str, Any]:
    """The estimate beside what the run did: per PLM and in total (public work only)."""
    timings = manifest.timings_s
    measured = {}
    for plm in plan.summary["plms"]:
        measured[plm] = {
            "engine": engines.get(plm, "?"),
            "generated": sum(r.generated.get(plm, 0) for r in manifest.rounds),
            "kept": sum(r.kept.get(plm, 0) for r in manifest.rounds),
            "tokens": int(manifest.tokens.get(plm, 0)),
            "startup_s": round(timings.get(f"startup:{plm}", 0.0), 1),
            "generation_s": round(timings.get(f"generation:{plm}", 0.0), 1),
        }
    stages = ("generation", "embedding", "io")
    public = sum(timings.get(s, 0.0) for s in stages) + sum(
        v for k, v in timings.items() if k.startswith(("startup:", "shutdown:"))
    )
    return {
        "plan": plan.to_dict(),
        "measured": {"plms": measured, "public_work_s": round(public, 1),
                     "note": "start-ups, generation, embedding and writing; not the private records' part"},
    }  # fmt: skip

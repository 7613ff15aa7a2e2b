"""Load: N = 100,000 synthetic samples from M = 1,000 private records, in bounded memory.

The subject is the pipeline's memory and I/O at scale, so generation comes from
``FakeEngineForUnitTests`` (named as such: instant, deterministic text) and embeddings from
``HashEmbedderForTests`` (a 64-dim hash-based test double). Voting (exact FAISS search),
noise, selection, prompts, cleaning and the Parquet checkpoints are the real ones. The run is a
subprocess so that its peak resident memory (ru_maxrss) is its own.

Measured here (2 shared cores): about 385 MiB peak RSS and 20-25 s for N=100k, T=3; about
165 MiB at N=1k and 250 MiB at N=20k, i.e. a fixed ~160 MiB (Python, NumPy, Arrow, FAISS)
plus ~2.2 KiB per synthetic sample (texts, 64-dim embeddings, rows held for the round).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.fakes import WORDS

ROOT = Path(__file__).resolve().parents[1]
N, M, T = 100_000, 1_000, 3


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_hundred_thousand_samples_in_bounded_memory(tmp_path):
    rng = np.random.default_rng(0)
    labels = ["positive", "neutral", "negative"]
    lines = ["text,label"] + [
        f"record {i} {' '.join(rng.choice(WORDS, 10))},{labels[i % 3]}" for i in range(M)
    ]
    (tmp_path / "private.csv").write_text("\n".join(lines) + "\n")
    cfg = dict(plms=["a", "b"], task="drugs", private=str(tmp_path / "private.csv"), private_limit=None,
               n=N, rounds=T, q=8, s=8, noise_seed=1, engine_args={"concurrent": False},
               max_new_tokens=16)  # fmt: skip
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    report = tmp_path / "report.json"
    env = os.environ | {"WASP_TEST_REPORT": str(report)}
    env.pop("WASP_TEST_KILL_AT", None)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tests.fakes", str(tmp_path / "cfg.json"), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=175)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(report.read_text())
    print(
        f"\nN={N} M={M} T={T}: peak RSS {measured['peak_rss_mib']:.0f} MiB, wall {measured['wall_s']:.1f} s"
    )

    meta = pq.ParquetFile(out / "synthetic.parquet").metadata
    assert meta.num_rows == N
    texts = pq.read_table(out / "synthetic.parquet", columns=["text"]).column("text").to_pylist()
    assert len(set(texts)) == N  # no copies, no padding
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["private_data"]["requested_m"] is None  # every one of the M records votes
    assert manifest["privacy"]["ledger"]["compositions"] == T - 1  # the votes (the labels split evenly)
    # A sample one PLM could not write (a rare reject of the gate or the label check) is made up
    # by the other within the round: nothing is missing.
    assert all(r["missing"] == 0 for r in manifest["rounds"])
    # Bounded: about 2.2 KiB per sample over a ~160 MiB base here; 1 GiB leaves room for other
    # allocators and platforms but catches anything quadratic (e.g. an N x M distance matrix).
    assert measured["peak_rss_mib"] < 1024

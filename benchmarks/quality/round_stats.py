"""Per round and PLM, what a run's samples look like: read from the run's round tables.

The round tables (``RUN/private/rounds/round-*.parquet``) and the noisy votes
(``votes-*.parquet``) are the operator's files: fine inside a benchmark, never published.  For
each round and PLM:

* ``label_agreement``: the share of its samples whose label a balanced logistic regression
  trained on ``TASK:fit`` gives too (as ``evaluate``'s label agreement, per round);
* ``junk_share``: the share of samples with two or more emoji, hashtags or mentions (the
  ``reference_junk_share`` of the task's real ``fit`` records is the yardstick: real tweets have
  many);
* ``ngram_overlap``: the mean share of a sample's word 4-grams found in the texts its
  in-context examples were drawn from.  Which examples a prompt showed is not recorded, so this is
  the round's selected pools, rebuilt from the previous round's noisy votes exactly as the run
  chose them (``select_pools``): good and bad pools for a contrastive prompt, the good pool for a
  few-shot one; zero-shot samples have none;
* ``similarity``: the mean cosine similarity between two of its samples of the same label (the
  judge's embeddings): rising over the rounds, the samples are collapsing onto a few examples;
* ``rejects``: generated samples thrown away, by reason (from the manifest).

And per round over all its PLMs (:func:`round_diversity`, issue 59: the loop must not narrow the
data below round 0's diversity): the same-label cosine, the share of distinct word bigrams, the
FID of the round's own samples to the task's validation split, and, for a round whose votes were
released, the share of the noisy near-votes' variance that the public noise does not explain.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

NGRAM = 4
_JUNK = re.compile(r"[#@]\w+|[\U0001F000-\U0001FAFF\u2600-\u27BF]")
_WORD = re.compile(r"\w+")


def junk_count(text: str) -> int:
    """Emoji, hashtags and mentions in ``text``."""
    return len(_JUNK.findall(text))


def junk_share(texts: list[str]) -> float | None:
    return float(np.mean([junk_count(t) >= 2 for t in texts])) if texts else None


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def overlap(text: str, pool: set[tuple[str, ...]]) -> float | None:
    grams = ngrams(text)
    return len(grams & pool) / len(grams) if grams else None


def round_tables(run_dir: Path) -> list[Any]:
    """Each round's samples with their votes, in round order (the run's private round files)."""
    import pyarrow.parquet as pq

    return [pq.read_table(p) for p in sorted((run_dir / "private" / "rounds").glob("round-*.parquet"))]


def voted_samples(run_dir: Path, tables: list[Any], t: int) -> tuple[Any, Any] | None:
    """Round ``t``'s votes file and the samples it ranked (in its row order, the columns of
    ``tables``); None where round ``t`` did not vote.  A vote ranks the samples written so far, or
    the round's own (as ``--voted-samples newest`` did, commit f7b6f4b): rows are matched by id,
    never by position."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = run_dir / "private" / "rounds" / f"votes-{t:03d}.parquet"
    if not path.exists():
        return None
    votes = pq.read_table(path)
    synth = pa.concat_tables(tables[: t + 1])
    row_of = {sample: row for row, sample in enumerate(synth.column("id").to_pylist())}
    missing = [sample for sample in votes.column("id").to_pylist() if sample not in row_of]
    if missing:
        raise ValueError(f"{path}: {len(missing)} voted ids are no sample written through round {t}")
    return synth.take([row_of[sample] for sample in votes.column("id").to_pylist()]), votes


def pools_per_round(
    run_dir: Path,
    tables: list[Any],
    labels: list[str],
    s: int,
) -> dict[int, dict]:
    """Round ``t+1`` -> label -> ``(good texts, bad texts)``: the pools the votes of round ``t``
    chose (the run's own post-processing, replayed from its votes file)."""
    from wasp_vllm.pipeline.selection import select_pools

    pools: dict[int, dict] = {}
    for t in range(len(tables) - 1):
        try:
            voted = voted_samples(run_dir, [tb.select(["id", "text", "label"]) for tb in tables], t)
        except ValueError:
            continue  # not the layout this replay knows: no overlap rather than a wrong one
        if voted is None:
            continue
        synth, votes = voted
        texts = synth.column("text").to_pylist()
        label_idx = np.array([labels.index(x) for x in synth.column("label").to_pylist()])
        near = np.asarray(votes.column("h_near").to_numpy(), dtype=float)
        # H_far is released only where the prompts show the far pool
        far = (
            np.asarray(votes.column("h_far").to_numpy(), dtype=float)
            if "h_far" in votes.column_names
            else None
        )
        chosen = select_pools(near, far, label_idx, s, len(labels))
        pools[t + 1] = {
            labels[c]: ([texts[i] for i in p.good], [texts[i] for i in p.bad]) for c, p in chosen.items()
        }
    return pools


class ReferenceJudge:
    """Per task, the label a classifier trained on ``TASK:fit`` gives a text (trained once), and
    the embeddings of the task's validation split (the yardstick of a round's FID)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self._fitted: dict[str, Any] = {}
        self._validation: dict[str, np.ndarray] = {}

    def validation_embeddings(self, task_name: str) -> np.ndarray:
        from wasp_vllm.data.records import load_test
        from wasp_vllm.tasks import get_task

        if task_name not in self._validation:
            texts = load_test(f"{task_name}:validation", get_task(task_name)).texts
            self._validation[task_name] = np.asarray(self.embedder.encode(texts), dtype=np.float64)
        return self._validation[task_name]

    def predict(self, task_name: str, texts: list[str]) -> np.ndarray:
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        from wasp_vllm.data.records import load_private
        from wasp_vllm.evaluation.classifier import LOGREG_C, LOGREG_MAX_ITER
        from wasp_vllm.tasks import get_task

        if task_name not in self._fitted:
            ref = load_private(f"{task_name}:fit", get_task(task_name))
            emb = self.embedder.encode(ref.texts)
            scaler = StandardScaler().fit(emb)
            clf = LogisticRegression(C=LOGREG_C, max_iter=LOGREG_MAX_ITER, class_weight="balanced")
            self._fitted[task_name] = (scaler, clf.fit(scaler.transform(emb), ref.labels))
        scaler, clf = self._fitted[task_name]
        return np.asarray(clf.predict(scaler.transform(self.embedder.encode(texts))), dtype=np.int64)


def round_stats(run_dir: Path, manifest: dict[str, Any], judge: ReferenceJudge) -> list[dict[str, Any]]:
    """One entry per round and PLM (see the module doc)."""
    from wasp_vllm.tasks import get_task

    task = get_task(manifest["task"])
    tables = round_tables(run_dir)
    if not tables:
        return []
    pools = pools_per_round(run_dir, tables, list(task.labels), int(manifest["config"]["s"]))
    records = {r["round"]: r for r in manifest["rounds"]}
    out = []
    for t, table in enumerate(tables):
        rows = table.select(["text", "label", "plm", "prompt_kind"]).to_pylist()
        predicted = judge.predict(task.name, [r["text"] for r in rows]) if rows else np.zeros(0)
        for plm in manifest["config"]["plms"]:
            mine = [(r, int(p)) for r, p in zip(rows, predicted, strict=True) if r["plm"] == plm]
            entry = _one(t, plm, mine, pools.get(t, {}), records.get(t, {}), task.labels)
            out.append(entry | {"similarity": same_label_similarity([r for r, _ in mine], judge.embedder)})
    return out


def distinct_bigrams(texts: list[str]) -> float | None:
    """Distinct word bigrams over all bigrams of ``texts`` (None: no bigram): falling over the
    rounds, the samples repeat each other's phrasing."""
    grams = [g for text in texts for g in _bigrams(text)]
    return len(set(grams)) / len(grams) if grams else None


def _bigrams(text: str) -> list[tuple[str, str]]:
    words = _WORD.findall(text.lower())
    return list(zip(words, words[1:], strict=False))


def signal_share(h_near: np.ndarray, sigma: float | None) -> float | None:
    """``1 - sigma^2 / var(H_near)``, floored at 0: how much of the released votes' spread the
    public noise does not explain (None without noise or votes)."""
    h = np.asarray(h_near, dtype=float)
    if sigma is None or h.size < 2:
        return None
    spread = float(np.var(h, ddof=1))
    return 0.0 if spread <= 0.0 else max(0.0, 1.0 - float(sigma) ** 2 / spread)


def round_diversity(
    run_dir: Path, task: str, sigma: float | None, judge: ReferenceJudge
) -> list[dict[str, Any]]:
    """Per round over all its PLMs (see the module doc): ``round``, ``n``, ``same_label_cosine``,
    ``distinct_2``, ``fid_validation`` and ``signal_share`` (None where the round released no vote)."""
    import pyarrow.parquet as pq

    from wasp_vllm.evaluation.metrics import fid

    validation = judge.validation_embeddings(task)
    out = []
    for t, table in enumerate(round_tables(run_dir)):
        rows = table.select(["text", "label"]).to_pylist()
        texts = [r["text"] for r in rows]
        votes = run_dir / "private" / "rounds" / f"votes-{t:03d}.parquet"
        h_near = (
            pq.read_table(votes, columns=["h_near"]).column("h_near").to_numpy() if votes.exists() else None
        )
        spread = fid(np.asarray(judge.embedder.encode(texts)), validation) if len(texts) > 1 else None
        out.append({
            "round": t, "n": len(rows),
            "same_label_cosine": same_label_similarity(rows, judge.embedder),
            "distinct_2": distinct_bigrams(texts),
            "fid_validation": spread,
            "signal_share": None if h_near is None else signal_share(h_near, sigma),
        })  # fmt: skip
    return out


def same_label_similarity(rows: list[dict], embedder: Any) -> float | None:
    """The mean cosine similarity over pairs of samples of the same label (None: no such pair)."""
    if not rows:
        return None
    vecs = np.asarray(embedder.encode([r["text"] for r in rows]))
    return same_label_cosine(vecs, np.array([r["label"] for r in rows]))


def same_label_cosine(embeddings: np.ndarray, labels: np.ndarray) -> float | None:
    """The mean cosine similarity over pairs of rows of the same label (None: no such pair)."""
    sums, pairs = 0.0, 0
    for label in np.unique(labels):
        vecs = np.asarray(embeddings[labels == label], dtype=np.float64)
        if len(vecs) < 2:
            continue
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        total = vecs.sum(axis=0)
        sums += float(total @ total) - len(vecs)  # every ordered pair's cosine, less the diagonal
        pairs += len(vecs) * (len(vecs) - 1)
    return sums / pairs if pairs else None


def _one(
    t: int, plm: str, rows: list[tuple[dict, int]], pools: dict, record: dict, labels: list[str]
) -> dict[str, Any]:
    texts = [r["text"] for r, _ in rows]
    overlaps = []
    for r, _ in rows:
        good, bad = pools.get(r["label"], ([], []))
        shown = {"contrastive": good + bad, "few_shot": good}.get(r["prompt_kind"], [])
        if shown:
            overlaps.append(overlap(r["text"], set().union(*(ngrams(x) for x in shown))))
    measured = [o for o in overlaps if o is not None]
    kinds: dict[str, int] = {}
    for r, _ in rows:
        kinds[r["prompt_kind"]] = kinds.get(r["prompt_kind"], 0) + 1
    return {
        "round": t,
        "plm": plm,
        "n": len(rows),
        "prompt_kinds": kinds,
        "label_agreement": float(np.mean([labels[p] == r["label"] for r, p in rows])) if rows else None,
        "junk_share": junk_share(texts),
        "ngram_overlap": float(np.mean(measured)) if measured else None,
        "rejects": dict(sorted((record.get("rejects") or {}).get(plm, {}).items())),
    }


def mean_over_seeds(entries: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The per-round entries of several seeds of one method, averaged per (round, PLM); rejects
    summed over the seeds."""
    groups: dict[tuple[int, str], list[dict]] = {}
    for entry in (e for seed in entries for e in seed):
        groups.setdefault((entry["round"], entry["plm"]), []).append(entry)
    out = []
    for (t, plm), group in sorted(groups.items()):
        rejects: dict[str, int] = {}
        for g in group:
            for reason, count in g["rejects"].items():
                rejects[reason] = rejects.get(reason, 0) + count
        row: dict[str, Any] = {"round": t, "plm": plm, "seeds": len(group), "n": sum(g["n"] for g in group)}
        for key in ("label_agreement", "junk_share", "ngram_overlap", "similarity"):
            vals = [g[key] for g in group if g.get(key) is not None]  # similarity: runs kept before it
            row[key] = float(np.mean(vals)) if vals else None
        out.append(row | {"rejects": dict(sorted(rejects.items()))})
    return out

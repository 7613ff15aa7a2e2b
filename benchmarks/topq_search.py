"""Exact Top-Q search: ``wasp_vllm.privacy.search.topq_near_far`` against numpy and torch brute forces.

``topq_near_far`` (FAISS flat candidates, float64 rescoring, an error certificate) and the brute
forces (float32 GEMM distances + top-k) get the same random float32 data: d=384, 3 labels, q=8,
M private rows against N synthetic ones.  Every method runs on every (M, N) on the same arrays
in one process; the table gives seconds (best of 3 when a run takes < 2 s), each brute force's
time as a ratio of FAISS's, and the share of rows on which it returns exactly FAISS's neighbours.
Combinations expected (from the smaller ones) to exceed ~60 s or ~8 GB are skipped and marked so.
On a GPU, FAISS GPU and torch on CUDA are measured too.

    python -m benchmarks.topq_search [--quick] [--out benchmarks/results]

writes ``topq_search.{md,json,png}``; ``--from-json FILE`` re-renders a saved result.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_cli, report

NAME = "topq_search"
TITLE = "Exact Top-Q search: FAISS with rescoring against brute force"
FAISS = "faiss (topq_near_far)"
log = logging.getLogger(NAME)


@dataclass(frozen=True)
class Settings:
    m: tuple[int, ...] = (100, 1_000, 10_000)
    n: tuple[int, ...] = (6_000, 100_000, 1_000_000)
    dim: int = 384
    labels: int = 3
    q: int = 8
    budget_s: float = 60.0
    budget_gb: float = 8.0
    gpu: bool = False


def make_settings(quick: bool, gpu: bool) -> Settings:
    return Settings(m=(100, 1_000), n=(6_000, 100_000), gpu=gpu) if quick else Settings(gpu=gpu)


def numpy_topq(
    p: np.ndarray, pl: np.ndarray, s: np.ndarray, sl: np.ndarray, q: int, chunk_bytes: int = 256 << 20
) -> tuple[np.ndarray, np.ndarray]:
    """Plain numpy brute force: float32 GEMM distances, argpartition, then sort the q found."""
    near = np.full((p.shape[0], q), -1, dtype=np.int64)
    far = np.full((p.shape[0], q), -1, dtype=np.int64)
    for label in np.unique(pl):
        prows, srows = np.flatnonzero(pl == label), np.flatnonzero(sl == label)
        if srows.size == 0:
            continue
        base = s[srows]
        bn = np.einsum("ij,ij->i", base, base)
        n, k = srows.size, min(q, srows.size)
        step = max(1, chunk_bytes // (4 * n))
        for i0 in range(0, prows.size, step):
            rows = prows[i0 : i0 + step]
            d = bn[None, :] - 2.0 * (p[rows] @ base.T)  # |x|^2 is constant per row: ordering unchanged
            for out, sign in ((near, 1.0), (far, -1.0)):
                key = sign * d
                idx = (
                    np.argpartition(key, k - 1, axis=1)[:, :k]
                    if k < n
                    else np.tile(np.arange(n), (rows.size, 1))
                )
                order = np.argsort(np.take_along_axis(key, idx, axis=1), axis=1, kind="stable")
                out[rows, :k] = srows[np.take_along_axis(idx, order, axis=1)]
    return near, far


def torch_topq(
    p: np.ndarray,
    pl: np.ndarray,
    s: np.ndarray,
    sl: np.ndarray,
    q: int,
    device: str = "cpu",
    chunk_bytes: int = 256 << 20,
) -> tuple[np.ndarray, np.ndarray]:
    """torch brute force (CPU or CUDA): mm distances + topk smallest / largest."""
    import torch

    near = np.full((p.shape[0], q), -1, dtype=np.int64)
    far = np.full((p.shape[0], q), -1, dtype=np.int64)
    with torch.inference_mode():
        for label in np.unique(pl):
            prows, srows = np.flatnonzero(pl == label), np.flatnonzero(sl == label)
            if srows.size == 0:
                continue
            base = torch.from_numpy(np.ascontiguousarray(s[srows])).to(device)
            queries = torch.from_numpy(np.ascontiguousarray(p[prows])).to(device)
            bn = (base * base).sum(1)
            k, step = min(q, srows.size), max(1, chunk_bytes // (4 * srows.size))
            srows_t = torch.from_numpy(srows).to(device)
            for i0 in range(0, prows.size, step):
                d = bn[None, :] - 2.0 * (queries[i0 : i0 + step] @ base.T)
                rows = prows[i0 : i0 + step]
                near[rows, :k] = srows_t[torch.topk(d, k, dim=1, largest=False).indices].cpu().numpy()
                far[rows, :k] = srows_t[torch.topk(d, k, dim=1, largest=True).indices].cpu().numpy()
    return near, far


def methods(gpu: bool) -> dict[str, Callable[..., Any]]:
    from wasp_vllm.privacy import search

    out: dict[str, Callable[..., Any]] = {
        FAISS: lambda *a: search.topq_near_far(*a, use_gpu=False),
        "numpy brute force": numpy_topq,
        "torch brute force": partial(torch_topq, device="cpu"),
    }
    if gpu and search.gpu_available():
        out["faiss GPU (topq_near_far)"] = lambda *a: search.topq_near_far(*a, use_gpu=True)
    if gpu:
        out["torch brute force (cuda)"] = partial(torch_topq, device="cuda")
    return out


def memory_gb(method: str, m: int, n: int, d: int) -> float:
    inputs = 4.0 * (m + n) * d
    if method.startswith("faiss"):
        # float64 copy of the synthetic rows, per-label float64 copies and the float32 index: ~22 B/value
        return (inputs + 18.0 * n * d) / 2**30
    return (inputs + 4.0 * n * d / 3 + (256 << 20)) / 2**30


def predict_seconds(done: list[tuple[int, int, float]], m: int, n: int) -> float | None:
    """Extrapolate from finished combinations: cost ~ M*N (distances), and at least ~ N (index)."""
    preds = [t0 * (m * n) / (m0 * n0) for m0, n0, t0 in done if m0 * n0 <= m * n]
    preds += [t0 * n / n0 for m0, n0, t0 in done if m0 == m or n0 <= n]
    return max(preds) if preds else None


def time_method(
    fn: Callable[..., Any], data: tuple[Any, ...], q: int, reps: int, cuda: bool
) -> tuple[float, Any]:
    """Best of ``reps`` runs (seconds) and the last result."""
    import torch

    times, res = [], None
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        res = fn(*data, q)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times), res


def run_combo(
    s: Settings,
    m: int,
    n: int,
    fns: dict[str, Callable[..., Any]],
    done: dict[str, list[tuple[int, int, float]]],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Every method on one (M, N), unless its memory or time estimate is over budget."""
    data: tuple[Any, ...] | None = None
    results: dict[str, Any] = {}
    for name, fn in fns.items():
        mem, est = memory_gb(name, m, n, s.dim), predict_seconds(done[name], m, n)
        if mem > s.budget_gb:
            results[name] = {"skipped": f"needs ~{mem:.1f} GB > {s.budget_gb:.0f} GB"}
            continue
        if est is not None and est > s.budget_s:
            results[name] = {"skipped": f"est. {est:.0f} s > {s.budget_s:.0f} s"}
            continue
        if data is None:
            data = (
                rng.standard_normal((m, s.dim), dtype=np.float32),
                rng.integers(0, s.labels, size=m),
                rng.standard_normal((n, s.dim), dtype=np.float32),
                rng.integers(0, s.labels, size=n),
            )
        reps = 3 if (est or 0.0) < 2.0 else 1
        sec, res = time_method(fn, data, s.q, reps, cuda="cuda" in name or "GPU" in name)
        done[name].append((m, n, sec))
        results[name] = {"seconds": round(sec, 4), "reps": reps, "result": res}
        log.info("search M=%d N=%d %-28s %8.3f s", m, n, name, sec)
    ref = results.get(FAISS, {}).get("result")
    for r in results.values():
        res = r.pop("result", None)
        if res is not None and ref is not None:
            same = np.all(res[0] == ref[0], axis=1) & np.all(res[1] == ref[1], axis=1)
            r["agree_with_faiss"] = round(float(np.mean(same)), 6)
    return {"m": m, "n": n, "methods": results}


def measure(s: Settings) -> dict[str, Any]:
    fns = methods(s.gpu)
    combos = sorted(((m, n) for m in s.m for n in s.n), key=lambda mn: (mn[0] * mn[1], mn[1]))
    done: dict[str, list[tuple[int, int, float]]] = {k: [] for k in fns}
    rng, rows = np.random.default_rng(0), []
    for m, n in combos:
        gc.collect()
        rows.append(run_combo(s, m, n, fns, done, rng))
    return {"rows": rows}


def method_names(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for r in rows for k in r["methods"]))


def table(payload: dict[str, Any]) -> report.Table:
    s, rows = payload["settings"], payload["results"]["rows"]
    names = method_names(rows)
    others = [k for k in names if k != FAISS]
    t = report.Table(
        f"Exact Top-Q search (q={s['q']}, d={s['dim']}, {s['labels']} labels, random float32)",
        ["M private", "N synthetic", *(f"{k} s" for k in names), *(f"{k} / faiss" for k in others)],
    )
    for r in rows:
        mm = r["methods"]
        row: list[Any] = [f"{r['m']:,}", f"{r['n']:,}"]
        row += [
            mm[k]["seconds"]
            if "seconds" in mm.get(k, {})
            else f"skipped ({mm.get(k, {}).get('skipped', 'n/a')})"
            for k in names
        ]
        base = mm.get(FAISS, {}).get("seconds")
        for k in others:
            v = mm.get(k, {}).get("seconds")
            row.append(round(v / base, 2) if (v is not None and base) else "-")
        t.rows.append(row)
    agree = {
        k: min(
            (
                r["methods"][k]["agree_with_faiss"]
                for r in rows
                if "agree_with_faiss" in r["methods"].get(k, {})
            ),
            default=float("nan"),
        )
        for k in others
    }
    t.notes += [
        "faiss = wasp_vllm.privacy.search.topq_near_far: float32 FAISS candidates, float64 rescoring, error "
        "certificate (exact: equals a float64 brute force with its tie rule). Brute forces are plain "
        "float32 GEMM + top-k.",
        "rows identical to faiss (near and far), worst combination: "
        + ", ".join(f"{k} {v:.4f}" for k, v in agree.items()),
        f"skipped: combinations estimated (from the smaller ones) to exceed ~{s['budget_s']:.0f} s, or "
        f"~{s['budget_gb']:.0f} GB of memory; times are the best of 3 when a run takes < 2 s.",
    ]
    return t


def plot(payload: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    rows = payload["results"]["rows"]
    series: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for r in rows:
        for k, v in r["methods"].items():
            if "seconds" in v:
                series.setdefault((k, r["m"]), []).append((r["n"], v["seconds"]))
    names, ms = method_names(rows), sorted({m for _, m in series})
    fig, ax = plt.subplots(figsize=(7, 5))
    for (k, m), pts in sorted(series.items()):
        pts.sort()
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            marker="o",
            color=f"C{names.index(k)}",
            linestyle=["-", "--", ":", "-."][ms.index(m) % 4],
            label=f"{k.split(' (')[0]}, M={m:,}",
        )
    ax.set(
        xscale="log", yscale="log", xlabel="N synthetic samples", ylabel="seconds", title="exact Top-Q search"
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = bench_cli.parser(__doc__, NAME)
    p.add_argument("--budget-s", type=float, help="skip combinations estimated slower (default 60)")
    p.add_argument("--budget-gb", type=float, help="skip combinations needing more memory (default 8)")
    args = p.parse_args(argv)
    if args.from_json:
        payload = report.read_json(args.from_json)
    else:
        bench_cli.setup_logging()
        from wasp_vllm.engines.devices import gpu_available

        s = bench_cli.override(
            make_settings(args.quick, gpu_available()), budget_s=args.budget_s, budget_gb=args.budget_gb
        )
        payload = report.start(__file__, sys.argv[1:] if argv is None else argv, asdict(s))
        payload["results"] = measure(s)
        report.finish(payload)
    report.write_all(args.out, NAME, TITLE, payload, [table(payload)], plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which records vote: the --m draw, the per-user cap and the party assignment move at most what the
accountant assumes when one record (or one user) of the input file changes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wasp_vllm.privacy.accountant import Neighbour, wasp_sensitivity
from wasp_vllm.privacy.sampling import assign_parties, bound_contributions, select_top_m, voting_neighbour
from wasp_vllm.privacy.secrets import record_bytes
from wasp_vllm.privacy.voting import clean_histograms


def _records(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [
        record_bytes([f"text {i} {rng.integers(10**9)}", ["a", "b", "c"][i % 3], None, None])
        for i in range(n)
    ]


def _kept(records: list[bytes], m: int, seed: int = 0) -> set[bytes]:
    return {records[i] for i in select_top_m(records, m, seed)}


def _swaps(before: set[bytes], after: set[bytes]) -> tuple[int, int]:
    return len(before - after), len(after - before)


@settings(max_examples=60, deadline=None, database=None)
@given(n=st.integers(2, 60), m=st.integers(1, 40), seed=st.integers(0, 3), data=st.data())
def test_one_record_more_or_less_swaps_at_most_one_drawn_record(n, m, seed, data):
    records = _records(n, seed)
    base = _kept(records, m, seed)
    gone = data.draw(st.integers(0, n - 1))
    out, into = _swaps(base, _kept(records[:gone] + records[gone + 1 :], m, seed))
    assert out <= 1 and into <= 1
    extra = record_bytes([f"a new record {data.draw(st.integers(0, 10**6))}", "a", None, None])
    out, into = _swaps(base, _kept([*records, extra], m, seed))
    assert out <= 1 and into <= 1
    replaced = records[:gone] + [extra] + records[gone + 1 :]
    out, into = _swaps(base, _kept(replaced, m, seed))
    assert out <= 1 and into <= 1


def test_the_draw_is_seeded_and_keeps_file_order():
    records = _records(50)
    idx = select_top_m(records, 10, seed=0)
    assert np.all(np.diff(idx) > 0) and len(idx) == 10
    assert np.array_equal(idx, select_top_m(records, 10, seed=0))
    assert not np.array_equal(idx, select_top_m(records, 10, seed=1))
    assert np.array_equal(select_top_m(records, 80, seed=0), np.arange(50))  # fewer than m: all
    with pytest.raises(ValueError):
        select_top_m(records, 0, seed=0)


def test_identical_records_are_interchangeable():
    records = [record_bytes(["same", "a", None, None])] * 5 + _records(5)
    assert len(select_top_m(records, 3, 0)) == 3


@settings(max_examples=40, deadline=None, database=None)
@given(k=st.integers(1, 5), m=st.integers(1, 30), seed=st.integers(0, 3), data=st.data())
def test_one_user_more_less_or_changed_moves_at_most_k_in_and_k_out(k, m, seed, data):
    n = 40
    records = _records(n, seed)
    users = [f"u{i % 7}" for i in range(n)]

    def voters(recs: list[bytes], us: list[str]) -> set[bytes]:
        bounded = bound_contributions(recs, us, k, seed)
        sub = [recs[i] for i in bounded]
        return {sub[i] for i in select_top_m(sub, m, seed)}

    base = voters(records, users)
    victim = f"u{data.draw(st.integers(0, 6))}"
    keep = [i for i, u in enumerate(users) if u != victim]
    removed = voters([records[i] for i in keep], [users[i] for i in keep])
    out, into = _swaps(base, removed)
    assert out <= k and into <= k
    heavy = [record_bytes([f"heavy {j}", "a", None, "heavy"]) for j in range(3 * k)]  # more than the cap
    added = voters(records + heavy, users + ["heavy"] * len(heavy))
    out, into = _swaps(base, added)
    assert out <= k and into <= k


def test_the_cap_looks_at_each_user_alone():
    records = _records(30)
    users = [f"u{i % 3}" for i in range(30)]
    kept = set(bound_contributions(records, users, 4, seed=0).tolist())
    assert len(kept) == 12
    # dropping every record of u2 changes nothing that u0 and u1 keep
    others = [i for i in range(30) if users[i] != "u2"]
    kept_without = bound_contributions([records[i] for i in others], [users[i] for i in others], 4, 0)
    assert {others[i] for i in kept_without} == {i for i in kept if users[i] != "u2"}


def test_parties_depend_on_each_record_alone_and_follow_the_dirichlet_skew():
    n = 400
    records = _records(n)
    labels = np.arange(n) % 4
    parties = assign_parties(records, labels, 4, 10, alpha=0.5, seed=0)
    assert parties.min() >= 0 and parties.max() < 10
    assert np.array_equal(parties, assign_parties(records, labels, 4, 10, alpha=0.5, seed=0))
    assert not np.array_equal(parties, assign_parties(records, labels, 4, 10, alpha=0.5, seed=1))
    fewer = assign_parties(records[1:], labels[1:], 4, 10, alpha=0.5, seed=0)
    assert np.array_equal(fewer, parties[1:])  # removing a record moves no other record

    def skew(alpha: float) -> float:
        tv = []
        for s in range(5):
            p = assign_parties(records, labels, 4, 10, alpha, s)
            overall = np.bincount(labels, minlength=4) / n
            for party in range(10):
                held = labels[p == party]
                if held.size:
                    tv.append(0.5 * np.abs(np.bincount(held, minlength=4) / held.size - overall).sum())
        return float(np.mean(tv))

    assert skew(0.1) > 2 * skew(100.0)
    with pytest.raises(ValueError, match="alpha"):
        assign_parties(records, labels, 4, 2, alpha=0.0, seed=0)


def test_voting_neighbour():
    assert voting_neighbour("add_remove", selected=False) is Neighbour.ADD_REMOVE
    assert voting_neighbour("add_remove", selected=True) is Neighbour.REPLACE
    assert voting_neighbour(Neighbour.REPLACE, selected=False) is Neighbour.REPLACE


def test_the_vote_vector_moves_by_at_most_the_sensitivity_the_draw_implies():
    """End to end on real votes: removing any one record of the file moves the votes of the drawn
    records by at most the replace sensitivity, which is what a --m run is accounted with."""
    rng = np.random.default_rng(3)
    n, m, q = 40, 12, 4
    records = _records(n, 3)
    emb = rng.normal(size=(n, 8))
    labels = np.arange(n) % 3
    synth, synth_labels = rng.normal(size=(60, 8)), rng.integers(0, 3, 60)

    def votes(rows: np.ndarray) -> np.ndarray:
        idx = rows[select_top_m([records[i] for i in rows], m, seed=0)]
        return np.concatenate(clean_histograms(emb[idx], labels[idx], synth, synth_labels, q))

    base = votes(np.arange(n))
    bound = wasp_sensitivity(q, voting_neighbour("add_remove", selected=True))
    moves = [np.linalg.norm(votes(np.delete(np.arange(n), i)) - base) for i in range(n)]
    assert max(moves) <= bound * (1 + 1e-12)
    assert max(moves) > wasp_sensitivity(q, "add_remove")  # a swap really does exceed add/remove

"""Audits with power (issue 21, item 2): every Gaussian release of a run, through the real code paths
(the run's plan from its settings, the real ``--m`` draw and contribution cap, the mechanism with
the run's secret, the ledger), is no more distinguishable than the ledger claims - and each audit,
with the noise cut by sqrt 2 (or the planted bug it is about), refutes the claim.

Every release is a Gaussian mechanism, and a composition of them is exactly ``mu``-GDP, so each
audit is a trade-off audit (:func:`~wasp_vllm.privacy.audit.gdp_audit`): with the canary's own vote
vector ``v = clean(D) - clean(D')`` as the test direction (the likelihood-ratio test, the strongest
there is), the true positive rate at several false-positive rates must stay under
``Phi(Phi^-1(FPR) + mu_claimed)``, where ``mu_claimed`` is the one behind the epsilon the ledger
publishes.

Trials are cheap: one audit instance is copied into ``BLOCKS`` labels (the votes of one label depend
on that label's records only and the noise is independent per coordinate, so every block is an
independent trial of the one-canary mechanism), and every batch draws a fresh run secret.  The
Top-q search is deterministic (tests/test_search.py), so the harness memoizes it; the noise, the
secret's streams and the ledger run for real in every trial.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest

import wasp_vllm.privacy.voting as voting
from wasp_vllm.config import RunConfig
from wasp_vllm.data.records import PrivateSet, draw_records
from wasp_vllm.pipeline.context import privacy_plan
from wasp_vllm.privacy.accountant import PrivacyLedger, PrivacyUnit
from wasp_vllm.privacy.audit import TradeoffAudit, clopper_pearson, gdp_audit
from wasp_vllm.privacy.gaussian import mu_for_epsilon
from wasp_vllm.privacy.mechanisms import CentralVoting, Voters, release_label_histogram
from wasp_vllm.privacy.plan import PrivacyPlan
from wasp_vllm.privacy.secrets import RunSecret

SQRT2 = math.sqrt(2.0)
EPSILON, DELTA, Q = 4.0, 1e-5, 4
BLOCKS, BATCHES = 400, 50  # 20,000 trials per side
DIM, PRIVATE, SYNTH = 8, 6, 12


def test_clopper_pearson_known_values():
    lo, hi = clopper_pearson(0, 100, 0.05)
    assert lo == 0.0 and hi == pytest.approx(0.0362, abs=1e-4)  # the "rule of three" region
    lo, hi = clopper_pearson(50, 100, 0.05)
    assert lo == pytest.approx(0.3983, abs=1e-4) and hi == pytest.approx(0.6017, abs=1e-4)
    with pytest.raises(ValueError):
        clopper_pearson(5, 3, 0.05)


def test_the_trade_off_audit_tells_sigma_from_sigma_over_sqrt_2():
    rng = np.random.default_rng(0)
    mu = mu_for_epsilon(EPSILON, DELTA)
    honest = gdp_audit(rng.normal(mu, 1, 20_000), rng.normal(0, 1, 20_000), mu)
    cut = gdp_audit(rng.normal(mu * SQRT2, 1, 20_000), rng.normal(0, 1, 20_000), mu)
    assert not honest.refuted and cut.refuted
    assert cut.mu_lower_bound > mu and honest.mu_lower_bound > 0.8 * mu  # close to tight when honest


# ----------------------------------------------------------------------------------- the harness


@pytest.fixture(autouse=True)
def memoized_search(monkeypatch):
    """The deterministic Top-q search, once per input (see the module docstring)."""
    real, cache = voting.topq_near_far, {}

    def search(p, pl, s, sl, q):
        key = (np.asarray(p).tobytes(), np.asarray(pl).tobytes(), np.asarray(s).tobytes(), q)
        if key not in cache:
            cache[key] = real(p, pl, s, sl, q)
        return cache[key]

    monkeypatch.setattr(voting, "topq_near_far", search)


Release = Callable[[object, RunSecret, PrivacyLedger], np.ndarray]


def _audit(
    release: Release,
    with_canary: object,
    without: object,
    plan: PrivacyPlan,
    block_of: np.ndarray,
    clean: tuple[np.ndarray, np.ndarray],
    releases: int = 1,
    batches: int = BATCHES,
) -> TradeoffAudit:
    """Scores per block: the sum of ``releases`` released vectors, less its mean under ``D'``,
    projected on the canary's move ``v`` (the per-block offset would only blur the pooled scores);
    a fresh secret and ledger for every batch."""
    sides, claimed = [], []
    v = clean[0] - clean[1]
    for data in (with_canary, without):
        scores = []
        for _ in range(batches):
            ledger = PrivacyLedger(plan.epsilon, plan.delta)
            released = release(data, RunSecret.generate(), ledger)
            scores.append(np.bincount(block_of, weights=(released - releases * clean[1]) * v,
                                      minlength=BLOCKS))  # fmt: skip
            claimed.append(ledger.spent_epsilon())
        sides.append(np.concatenate(scores))
    assert max(claimed) <= plan.epsilon * (1 + 1e-9)
    return gdp_audit(sides[0], sides[1], mu_for_epsilon(max(claimed), plan.delta))


def _synthetic(rng: np.random.Generator, labels_per_block: int) -> tuple[np.ndarray, np.ndarray]:
    n_labels = BLOCKS * labels_per_block
    return rng.normal(size=(n_labels * SYNTH, DIM)), np.repeat(np.arange(n_labels), SYNTH)


def _vote_releases(plan: PrivacyPlan, synth: tuple[np.ndarray, np.ndarray], noise_cut: float) -> Release:
    """Every voting round of the plan through CentralVoting; ``noise_cut`` plants sigma / cut."""

    def release(voters, secret, ledger):
        mechanism = CentralVoting(voters, Q, plan, secret, ledger)
        mechanism.sigma /= noise_cut  # the ledger still records the plan's sigma
        out = [mechanism.release(t, *synth) for t in range(plan.compositions)]
        return np.sum([_released(o) for o in out], axis=0)

    return release


def _released(votes) -> np.ndarray:
    """Everything a round releases: ``H_near``, then ``H_far`` where it is released."""
    return np.concatenate([votes.h_near, *([] if votes.h_far is None else [votes.h_far])])


def _clean_votes(voters: Voters, synth: tuple[np.ndarray, np.ndarray], histograms: int) -> np.ndarray:
    return np.concatenate(voting.clean_histograms(voters.embeddings, voters.labels, *synth, Q)[:histograms])


def _vote_audit(cfg: RunConfig, with_canary: Voters, without: Voters, synth, noise_cut: float = 1.0,
                released: int | None = None):  # fmt: skip
    """``released``: the histograms the mechanism really releases (default: as the plan says)."""
    plan = privacy_plan(cfg)
    histograms = released or plan.histograms
    clean = (_clean_votes(with_canary, synth, histograms), _clean_votes(without, synth, histograms))
    labels = np.concatenate([synth[1]] * histograms)  # the coordinates of H_near, then of H_far
    block_of = labels // ((labels.max() + 1) // BLOCKS)
    release = _vote_releases(plan, synth, noise_cut)
    return _audit(release, with_canary, without, plan, block_of, clean, plan.compositions)


def _holds(audit: TradeoffAudit) -> bool:
    """The claim stands, and the audit comes close to it: the canary attains the sensitivity the
    ledger charges, so the audit has the power to catch a sqrt 2 (printed for the closing note)."""
    print(f"audit: mu claimed {audit.mu_claimed:.4f}, lower bound {audit.mu_lower_bound:.4f}")
    return not audit.refuted and audit.mu_lower_bound > 0.8 * audit.mu_claimed


def _refutes(audit: TradeoffAudit) -> bool:
    print(f"audit (planted bug): mu claimed {audit.mu_claimed:.4f}, lower bound {audit.mu_lower_bound:.4f}")
    return audit.refuted


def _cfg(**overrides) -> RunConfig:
    base = {
        "epsilon": EPSILON,
        "delta": DELTA,
        "q": Q,
        "rounds": 2,
        "label_prior": "uniform",
        "private_limit": None,
    }
    return RunConfig(**{**base, **overrides})


# -------------------------------------------------------------------------- central voting


def _add_remove_instance(rng: np.random.Generator) -> tuple[Voters, Voters]:
    """Per block: PRIVATE records and a canary (an outlier, so nothing else shares its votes)."""
    emb = rng.normal(size=(BLOCKS * PRIVATE, DIM))
    labels = np.repeat(np.arange(BLOCKS), PRIVATE)
    canary = rng.normal(size=(BLOCKS, DIM)) * 3
    with_canary = Voters(np.vstack([emb, canary]), np.concatenate([labels, np.arange(BLOCKS)]))
    return with_canary, Voters(emb, labels)


@pytest.mark.parametrize("far_votes", ["on", "off"])
@pytest.mark.parametrize("rounds", [2, 5])
def test_central_votes_over_all_rounds_hold_their_claim_and_sigma_over_sqrt2_is_caught(rounds, far_votes):
    rng = np.random.default_rng(1)
    with_canary, without = _add_remove_instance(rng)
    synth = _synthetic(rng, 1)
    cfg = _cfg(rounds=rounds, far_votes=far_votes)
    assert privacy_plan(cfg).histograms == (2 if far_votes == "on" else 1)
    assert _holds(_vote_audit(cfg, with_canary, without, synth))
    assert _refutes(_vote_audit(cfg, with_canary, without, synth, noise_cut=SQRT2))


def test_a_run_that_pays_for_h_near_alone_and_releases_h_far_too_is_caught(monkeypatch):
    """The planted bug: the plan charges one histogram (few-shot prompts never show the far pool),
    the mechanism still releases both, at the one histogram's sigma."""
    rng = np.random.default_rng(1)
    with_canary, without = _add_remove_instance(rng)
    synth = _synthetic(rng, 1)
    cfg = _cfg(rounds=2, far_votes="auto")
    assert cfg.far_votes == "off" and privacy_plan(cfg).histograms == 1
    real_init = CentralVoting.__init__

    def releases_both(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.far = True

    monkeypatch.setattr(CentralVoting, "__init__", releases_both)
    assert _refutes(_vote_audit(cfg, with_canary, without, synth, released=2))


def _replace_instance(rng: np.random.Generator, seed: int) -> tuple[Voters, Voters]:
    """Per block a file of PRIVATE records and the same file plus a canary, both through the real
    ``--m`` draw (M = PRIVATE): the canary displaces the record of largest keyed hash.  Labels are
    chosen so that the two have different labels (disjoint votes: the replace move is attained)."""
    kept_with, kept_without = [], []
    for b in range(BLOCKS):
        while True:
            texts = [f"block {b} record {i} {rng.integers(10**9)}" for i in range(PRIVATE + 1)]
            small = PrivateSet(texts[:-1], np.array([0] * PRIVATE), ["a", "b"])
            large = PrivateSet(texts, np.array([0] * PRIVATE + [1]), ["a", "b"])
            before, after = (draw_records(d, PRIVATE, seed) for d in (small, large))
            if texts[-1] in after.texts:  # the canary is drawn: one record out, the canary in
                break
        kept_without.append(before)
        kept_with.append(after)
    embedding = {t: rng.normal(size=DIM) * 3 for d in kept_with + kept_without for t in d.texts}

    def voters(kept: list[PrivateSet]) -> Voters:
        emb = [embedding[t] for d in kept for t in d.texts]
        return Voters(np.array(emb), np.concatenate([2 * b + d.labels for b, d in enumerate(kept)]))

    return voters(kept_with), voters(kept_without)


def test_the_m_draw_canary_is_audited_at_the_replace_sensitivity(monkeypatch):
    rng = np.random.default_rng(2)
    with_canary, without = _replace_instance(rng, seed=3)
    synth = _synthetic(rng, 2)
    cfg = _cfg(private_limit=PRIVATE, seed=3)
    assert privacy_plan(cfg).neighbour == "replace"
    assert _holds(_vote_audit(cfg, with_canary, without, synth))
    # the planted bug: the plan forgets that an --m draw turns add/remove into replace
    import wasp_vllm.pipeline.context as context

    monkeypatch.setattr(context, "voting_neighbour", lambda file_neighbour, selected: file_neighbour)
    assert _refutes(_vote_audit(cfg, with_canary, without, synth))


def _user_instance(rng: np.random.Generator, k: int, seed: int) -> tuple[Voters, Voters]:
    """Per block: other users' records, and one user with 2k identical records, capped to k by the
    real contribution bound (identical embeddings: the user's k votes add up, the worst case)."""
    kept_with, kept_without, embedding = [], [], {}
    for b in range(BLOCKS):
        others = [f"b{b} other {i}" for i in range(PRIVATE)]
        user = [f"b{b} user record {i}" for i in range(2 * k)]
        point = rng.normal(size=DIM) * 3
        embedding.update({t: rng.normal(size=DIM) for t in others} | dict.fromkeys(user, point))
        users = np.array([f"o{i}" for i in range(PRIVATE)] + ["canary"] * (2 * k))
        full = PrivateSet(others + user, np.array([0] * (PRIVATE + 2 * k)), ["a"], users=users)
        kept_with.append(draw_records(full, None, seed, cap=k))
        kept_without.append(draw_records(full.subset(np.arange(PRIVATE)), None, seed, cap=k))

    def voters(kept: list[PrivateSet]) -> Voters:
        emb = [embedding[t] for d in kept for t in d.texts]
        return Voters(np.array(emb), np.concatenate([np.full(len(d), b) for b, d in enumerate(kept)]))

    return voters(kept_with), voters(kept_without)


def test_user_level_runs_are_audited_at_k_records(monkeypatch):
    rng = np.random.default_rng(4)
    k = 3
    with_canary, without = _user_instance(rng, k, seed=5)
    synth = _synthetic(rng, 1)
    cfg = _cfg(privacy_unit="user", max_records_per_user=k, user_col="user", seed=5)
    assert _holds(_vote_audit(cfg, with_canary, without, synth))
    # the planted bug: the cap is applied but the plan counts one record per user
    plan = dataclasses.replace(privacy_plan(cfg))
    monkeypatch.setattr(
        "wasp_vllm.pipeline.context.plan_privacy",
        lambda *a, **kw: __import__("wasp_vllm.privacy.plan", fromlist=["x"]).plan_privacy(
            *a, **{**kw, "unit": PrivacyUnit(kw["unit"].neighbour, 1)}
        ),
    )
    assert privacy_plan(cfg).sigma < plan.sigma
    assert _refutes(_vote_audit(cfg, with_canary, without, synth))


# ------------------------------------------------------------------------------- label prior


class _CutSecret(RunSecret):
    """The planted bug: every stream of this secret draws its normals with ``scale / cut``."""

    cut = SQRT2

    def generator(self, stream, *parts):
        real, cut = super().generator(stream, *parts), self.cut

        class Cut:
            def normal(self, loc, scale, size):
                return real.normal(loc, scale / cut, size)

        return Cut()


def _prior_audit(neighbour_labels: tuple[np.ndarray, np.ndarray], plan: PrivacyPlan, n_labels: int,
                 noise_cut: bool = False) -> TradeoffAudit:  # fmt: skip
    def release(labels, secret, ledger):
        if noise_cut:  # the ledger records the plan's sigma; the noise gets sigma / sqrt 2
            secret = _CutSecret(secret.key)
        return release_label_histogram(labels, n_labels, plan, secret, ledger)

    clean = [np.bincount(lab, minlength=n_labels).astype(float) for lab in neighbour_labels]
    block_of = np.arange(n_labels) // (n_labels // BLOCKS)
    # The prior's mu is small (its share of the budget) and its release cheap: 10x the trials.
    return _audit(release, *neighbour_labels, plan, block_of, (clean[0], clean[1]), batches=10 * BATCHES)


@pytest.mark.parametrize("drawn", [False, True])
def test_the_private_label_prior_holds_its_share_and_sigma_over_sqrt2_is_caught(drawn):
    cfg = _cfg(label_prior="private", rounds=5, **({"private_limit": 50} if drawn else {}))
    plan = privacy_plan(cfg)
    assert plan.prior_sigma is not None
    n_labels = 2 * BLOCKS
    base = np.repeat(np.arange(n_labels), 3)
    if drawn:  # replace: the canary (odd label) in, a record of the even label of its block out
        with_canary = np.concatenate(
            [base[base % 2 == 1], base[base % 2 == 0][::3], np.arange(1, n_labels, 2)]
        )
        without = np.concatenate([base[base % 2 == 1], base[base % 2 == 0][::3], np.arange(0, n_labels, 2)])
    else:
        with_canary, without = np.concatenate([base, np.arange(0, n_labels, 2)]), base
    # The ledger holds the prior's release only; its claim is the prior's share of mu^2.
    assert _holds(_prior_audit((with_canary, without), plan, n_labels))
    assert _refutes(_prior_audit((with_canary, without), plan, n_labels, noise_cut=True))

"""The mutants that matter: each plants one privacy bug in a scratch copy of the package, and the
tests named with it must then fail.  A mutant that survives means a property of the guarantee is
no longer tested.

Each mutant names the exact code it changes; when that code is rewritten, the mutant fails
loudly ("not found") instead of passing silently, and must be updated with it.  The broad
mutation score comes from ``make mutation`` (mutmut over ``privacy/``, the voting step and the
store); this list is the curated part that runs in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.mutation


@dataclass(frozen=True)
class Mutant:
    why: str
    file: str
    # (old, new) in ``file``, or (other file, old, new)
    edits: tuple[tuple[str, str] | tuple[str, str, str], ...]
    tests: tuple[str, ...]


NOISE = "tests/test_noise.py"
NEIGHBOURS = "tests/test_neighbouring.py"
AUDIT = "tests/test_audit.py"
RELEASES = "tests/test_release_checks.py"
MUTANTS = {
    "central-noise-sigma-over-100": Mutant(
        "the noise step gets sigma/100 while ledger and manifest report sigma",
        "wasp_vllm/privacy/mechanisms.py",
        (("self.q, self.sigma, rng, self.far)", "self.q, self.sigma / 100, rng, self.far)"),),
        (f"{NOISE}::test_the_noise_added_is_the_sigma_the_manifest_reports[False-auto]",),
    ),
    "far-votes-released-unpaid": Mutant(
        "a run that pays for H_near alone releases H_far too",
        "wasp_vllm/privacy/mechanisms.py",
        (("self.far: bool = plan.histograms == 2", "self.far: bool = True"),),
        (f"{NOISE}::test_the_noise_added_is_the_sigma_the_manifest_reports[False-auto]",),
    ),
    "federated-noise-sigma-over-100": Mutant(
        "the same on the federated path",
        "wasp_vllm/privacy/mechanisms.py",
        (("            self.sigma,\n", "            self.sigma / 100,\n"),),
        (f"{NOISE}::test_the_noise_added_is_the_sigma_the_manifest_reports[True-auto]",),
    ),
    "private-record-logged-lower-case": Mutant(
        "a private record logged lower-cased at DEBUG",
        "wasp_vllm/pipeline/context.py",
        (
            (
                "    private = draw_records(private, cfg.private_limit, cfg.seed, cap)\n",
                "    private = draw_records(private, cfg.private_limit, cfg.seed, cap)\n"
                "    __import__('logging').getLogger('wasp_vllm').debug('%s', private.texts[0].lower())\n",
            ),
        ),
        ("tests/test_reliability.py::test_private_text_never_leaves_a_cli_run",),
    ),
    "noise-key-not-read-back": Mutant(
        "the noise key is made anew instead of read back on resume",
        "wasp_vllm/pipeline/store.py",
        (
            ("        if self.key_path.exists():", "        if False:"),
            ("        if not create:", "        if False:"),
        ),
        (f"{NOISE}::test_noise_key_is_secret_private_and_read_back_on_resume",),
    ),
    "noise-key-world-readable": Mutant(
        "the noise key file is readable by everyone",
        "wasp_vllm/pipeline/store.py",
        (("secret.to_text()), mode=0o600)", "secret.to_text()), mode=0o644)"),),
        (f"{NOISE}::test_noise_key_is_secret_private_and_read_back_on_resume",),
    ),
    "noise-key-in-state-and-manifest": Mutant(
        "the noise key is copied into the run state (and from there the manifest)",
        "wasp_vllm/pipeline/loop.py",
        (
            (
                "                active=list(self.cfg.plms),\n",
                "                active=list(self.cfg.plms),\n"
                "                dropped={'key': secret.to_text()} if secret else {},\n",
            ),
        ),
        (f"{NOISE}::test_noise_key_is_secret_private_and_read_back_on_resume",),
    ),
    "resume-accepts-other-data": Mutant(
        "--resume against different private data",
        "wasp_vllm/pipeline/loop.py",
        (("state.data_fingerprint != self.ctx.private.fingerprint()", "False"),),
        (
            "tests/test_reliability.py::test_fingerprint_of_the_private_data_is_keyed_and_stays_with_the_operator",
        ),
    ),
    "resume-restarts-from-round-0": Mutant(
        "--resume quietly starts again from round 0 (same bytes: rounds are deterministic)",
        "wasp_vllm/pipeline/loop.py",
        (
            (
                "        if state is None:\n            state = RunState(",
                "        if True:\n            state = RunState(",
            ),
        ),
        (f"{NOISE}::test_noise_key_is_secret_private_and_read_back_on_resume",),
    ),
    "plain-hash-published": Mutant(
        "a plain SHA-256 of the records in the manifest",
        "wasp_vllm/pipeline/manifest.py",
        (
            (
                "search=faiss_build(),",
                'search=faiss_build() | {"sha": __import__("hashlib").sha256("".join(ctx.private.texts).encode()).hexdigest()},',
            ),
        ),
        (f"{NEIGHBOURS}::test_neighbouring_files_publish_the_same_bytes[replace-a-record]",),
    ),
    "record-count-published": Mutant(
        "the exact number of private records in the manifest",
        "wasp_vllm/pipeline/manifest.py",
        (("search=faiss_build(),", 'search=faiss_build() | {"records": len(ctx.private)},'),),
        (f"{NEIGHBOURS}::test_neighbouring_files_publish_the_same_bytes[remove-rare-label-record]",),
    ),
    "empty-label-warned-at-default-level": Mutant(
        "a warning at the default level names the labels without private records",
        "wasp_vllm/data/records.py",
        (
            (
                'debug_private(logger, "%s: labels with no records',
                'logger.warning("%s: labels with no records',
            ),
        ),
        (f"{NEIGHBOURS}::test_neighbouring_files_publish_the_same_bytes[remove-rare-label-record]",),
    ),
    "unstable-m-draw": Mutant(
        "the --m draw runs over positions, so one record more or less moves many",
        "wasp_vllm/privacy/sampling.py",
        (
            (
                '    kept = _order(records, range(len(records)), "select", seed)[:m]',
                "    kept = list(np.random.default_rng(seed).permutation(len(records))[:m])",
            ),
        ),
        ("tests/test_sampling.py::test_one_record_more_or_less_swaps_at_most_one_drawn_record",),
    ),
    "no-contribution-bounding": Mutant(
        "user-level DP without dropping a user's records beyond the public cap",
        "wasp_vllm/data/records.py",
        (
            (
                "        data = data.subset(bound_contributions(data.records(), units.tolist(), cap, seed))",
                "        pass",
            ),
        ),
        (
            "tests/test_strategies.py::test_removing_a_heavy_user_moves_the_real_votes_by_at_most_the_sensitivity",
        ),
    ),
    "federated-noise-from-a-short-seed": Mutant(
        "each party's noise from a 31-bit seed that can be brute-forced",
        "wasp_vllm/privacy/mechanisms.py",
        (
            (
                'noise=lambda party: secret.generator("federated-vote", round_index, party),',
                'noise=lambda party: __import__("numpy").random.default_rng([round_index, party, 7]),',
            ),
        ),
        (f"{NOISE}::test_federated_noise_comes_from_the_full_secret_key",),
    ),
    "empty-parties-add-no-noise": Mutant(
        "only parties holding records add noise, so the total depends on the data",
        "wasp_vllm/privacy/federated.py",
        (("        ids = np.arange(n_parties, dtype=np.int64)", "        pass"),),
        ("tests/test_federated.py::test_every_party_of_the_roster_adds_noise_even_without_records",),
    ),
    "private-timings-published": Mutant(
        "the time spent embedding private records and voting goes into the manifest",
        "wasp_vllm/pipeline/manifest.py",
        ((' if not k.startswith("private:")}', "}"),),
        (f"{NOISE}::test_published_timings_leave_out_private_work",),
    ),
    "hot-pate-noise-from-public-seed": Mutant(
        "Hot PATE's noise drawn from the public --seed",
        "wasp_vllm/cli/commands.py",
        (
            (
                'noise_rng=secret.generator("hotpate"),',
                'noise_rng=__import__("numpy").random.default_rng(seed),',
            ),
        ),
        ("tests/test_hotpate.py::test_the_cli_draws_hot_pate_noise_from_a_secret_key",),
    ),
    "hot-pate-noise-from-coordination-stream": Mutant(
        "Hot PATE's aggregation draws its noise from the public coordination randomness",
        "wasp_vllm/hotpate/steps.py",
        (("result = self.aggregator(hist, rng, noise_rng)", "result = self.aggregator(hist, rng)"),),
        ("tests/test_hotpate.py::test_the_noise_comes_from_its_own_stream_not_the_public_randomness",),
    ),
    "hot-pate-target-charging-noise-from-coordination-stream": Mutant(
        "Hot PATE's target-charging step draws its noise from the public coordination randomness",
        "wasp_vllm/hotpate/steps.py",
        (
            (
                "return self.mechanism(hist.tokens, hist.counts, hist.n_teachers, noise_rng)",
                "return self.mechanism(hist.tokens, hist.counts, hist.n_teachers, rng)",
            ),
        ),
        ("tests/test_hotpate_charging.py::test_target_charging_noise_comes_from_the_secret_stream",),
    ),
    "paper-formula-trusted-above-epsilon-1": Mutant(
        "the ledger checks a paper-mode run with the paper's formula only",
        "wasp_vllm/privacy/accountant.py",
        (
            ("        if max(after, claimed) > self.epsilon", "        if claimed > self.epsilon"),
            (
                "wasp_vllm/privacy/plan.py",
                "    if eps_exact > epsilon * (1.0 + BUDGET_RTOL):",
                "    if False:",
            ),
        ),
        ("tests/test_accountant.py::test_paper_formula_that_under_noises_is_refused",),
    ),
    "noise-seed-in-config-fingerprint": Mutant(
        "the config fingerprint hashes the noise seed (brute-forceable when small)",
        "wasp_vllm/config/run.py",
        (('VOLATILE = ("noise_seed", "license")', 'VOLATILE = ("license",)'),),
        (f"{NOISE}::test_the_config_fingerprint_does_not_hash_the_noise_seed",),
    ),
    "noise-cut-by-sqrt-2": Mutant(
        "the Gaussian mechanism adds sigma/sqrt 2 while the ledger records sigma (the audit's power)",
        "wasp_vllm/privacy/voting.py",
        (("noise = rng.normal(0.0, sigma, size=", "noise = rng.normal(0.0, sigma / 2**0.5, size="),),
        (f"{AUDIT}::test_central_votes_over_all_rounds_hold_their_claim_and_sigma_over_sqrt2_is_caught",),
    ),
    "m-draw-planned-as-add-remove": Mutant(
        "the plan forgets that an --m draw turns one record more or less into a swap",
        "wasp_vllm/privacy/sampling.py",
        (("    return Neighbour.REPLACE if selected else file_neighbour", "    return file_neighbour"),),
        (f"{AUDIT}::test_the_m_draw_canary_is_audited_at_the_replace_sensitivity",),
    ),
    "user-cap-not-in-the-plan": Mutant(
        "users keep k records but the plan charges one record per user",
        "wasp_vllm/pipeline/context.py",
        (("            privacy.records_per_unit,", "            1,"),),
        (f"{AUDIT}::test_user_level_runs_are_audited_at_k_records",),
    ),
    "label-prior-noise-over-100": Mutant(
        "the label prior adds a hundredth of its noise while the manifest reports the planned sigma",
        "wasp_vllm/privacy/mechanisms.py",
        (
            (
                "normal(0.0, float(plan.prior_sigma or 0.0), n_labels)",
                "normal(0.0, float(plan.prior_sigma or 0.0) / 100, n_labels)",
            ),
        ),
        (
            f"{RELEASES}::test_the_label_priors_noise_is_the_sigma_the_plan_and_ledger_record",
            f"{AUDIT}::test_the_private_label_prior_holds_its_share_and_sigma_over_sqrt2_is_caught",
        ),
    ),
    "hot-pate-replace-sensitivity-2": Mutant(
        "a replace in Hot PATE counted as a move of 2 (two teachers can move together: 2 sqrt 2)",
        "wasp_vllm/hotpate/steps.py",
        (("        return 2.0 * VOTE_SENSITIVITY", "        return 2.0"),),
        ("tests/test_hotpate_sensitivity.py",),
    ),
    "fid-not-marked-operator-only": Mutant(
        "evaluate's FID against the raw private set is reported as a publishable figure",
        "wasp_vllm/evaluation/results.py",
        (
            (
                "            out[OPERATOR_ONLY] = self.operator.to_json()",
                "            out |= self.operator.to_json()",
            ),
        ),
        ("tests/test_evaluate.py::test_evaluate_synthetic_end_to_end",),
    ),
    "run-folder-not-locked": Mutant(
        "a second run writes a folder another process is writing (rows mixed, rounds voted twice)",
        "wasp_vllm/pipeline/store.py",
        (("            self._lock = self._acquire()\n", "            pass\n"),),
        ("tests/test_run_lock.py::test_a_busy_folder_refuses_a_second_run_and_changes_nothing",),
    ),
    "private-path-published": Mutant(
        "the manifest names the private file by its path (a path names people and places)",
        "wasp_vllm/pipeline/manifest.py",
        (("    source = published_source(ctx.cfg.private)\n", "    source = ctx.cfg.private\n"),),
        ("tests/test_private_source.py::test_no_path_of_the_private_file_is_published",),
    ),
    "public-reference-checked-against-private-only": Mutant(
        "evaluate publishes the label agreement of a reference that is the run's own private file, or a "
        "copy of it (checked only against --private, never against the run's record keys)",
        "wasp_vllm/evaluation/reference.py",
        (
            (
                "    keys = RecordKeys.of_run(synthetic.parent)\n    if keys is None:\n",
                "    keys = None\n    if False:\n",
            ),
            ("        shared = keys.shared_with(texts, key)\n", "        shared = 0\n"),
        ),
        (
            "tests/test_reference_public.py::test_a_copy_a_hard_link_or_a_part_of_the_private_file_cannot_be_declared_public",
        ),
    ),
    "round-0-speed-recorded-under-a-private-label-prior": Mutant(
        "a run whose round 0 a private release steered (the label prior) leaves its speed for later plans",
        "wasp_vllm/pipeline/throughput.py",
        (("    if manifest.privacy.plan.steers_first_round:", "    if False:"),),
        (
            "tests/test_throughput_cache.py::test_a_run_whose_round_0_a_private_release_steered_records_nothing",
        ),
    ),
    "utility-check-published-clean": Mutant(
        "the utility check publishes the clean confusion matrices of the private records",
        "wasp_vllm/privacy/mechanisms.py",
        (("        return clean + noise\n", "        return clean + 0 * noise\n"),),
        (
            "tests/test_utility_check.py::test_the_released_matrices_carry_the_planned_noise_and_are_paid_for_first",
        ),
    ),
    "ledger-takes-an-unplanned-release": Mutant(
        "the ledger records a release the privacy plan did not make (a vote a policy slipped in)",
        "wasp_vllm/privacy/accountant.py",
        (
            (
                "        if self.planned is not None and (release not in self.planned or release in self.releases):",
                "        if False:",
            ),
        ),
        (
            "tests/test_policy.py::test_a_policy_asks_for_fewer_votes_the_plan_decides_and_the_ledger_enforces",
        ),
    ),
    "a-vote-after-an-empty-round-is-not-charged": Mutant(
        "a round that keeps nothing re-noises the same votes without charging the ledger",
        "wasp_vllm/privacy/mechanisms.py",
        (
            (
                "        self.ledger.record(self.plan.release(round_index))\n",
                "        if round_index == 0:\n            self.ledger.record(self.plan.release(round_index))\n",
            ),
        ),
        (f"{RELEASES}::test_a_round_that_keeps_nothing_is_still_voted_on_and_paid_for",),
    ),
    "hot-pate-auto-vllm-without-batch-invariance": Mutant(
        "Hot PATE's --engine auto picks vLLM on a GPU without VLLM_BATCH_INVARIANT=1 (a teacher's "
        "numbers move with other teachers' private prompts)",
        "wasp_vllm/hotpate/generate.py",
        (("            if not vllm_batch_invariant():\n", "            if False:\n"),),
        ("tests/test_hotpate_engine.py",),
    ),
    "reject-rate-cached": Mutant(
        "an earlier run's samples generated per kept sample (a function of its noisy votes) is cached "
        "and published in a later run's plan",
        "wasp_vllm/pipeline/throughput.py",
        (
            (
                '            "startup_s": round(float(m.get("startup_s") or 0.0), 1),\n',
                '            "startup_s": round(float(m.get("startup_s") or 0.0), 1),\n'
                '            "generated_per_kept": round(m["generated"] / max(1, m["kept"]), 3),\n',
            ),
            (
                "wasp_vllm/pipeline/estimate.py",
                "    regen = throughput.REGENERATION[",
                "    regen = throughput.load_records().get(throughput.key(spec, engine, device), {}).get("
                '"generated_per_kept") or throughput.REGENERATION[',
            ),
        ),
        (
            "tests/test_throughput_cache.py::test_an_earlier_run_on_neighbouring_files_leaves_the_same_later_bytes",
        ),
    ),
    "void-epsilon-run-throughput-recorded": Mutant(
        "a --noise-seed (void epsilon) or audit run leaves its measurements for later plans",
        "wasp_vllm/api.py",
        (("    if record_throughput and cfg.noise_seed is None:", "    if True:"),),
        ("tests/test_throughput_cache.py::test_void_epsilon_and_audit_runs_record_nothing",),
    ),
    "weak-audit-runs": Mutant(
        "an audit whose best possible bound cannot exceed the claim runs and reports no leak",
        "wasp_vllm/ops/audit.py",
        (("    if best <= epsilon:\n", "    if False:\n"),),
        ("tests/test_audit_power.py::test_a_weak_audit_is_refused_before_anything_runs",),
    ),
    "audit-canaries-drawn-away-by-m": Mutant(
        "the --m draw subsamples the audit's canaries away",
        "wasp_vllm/ops/audit.py",
        (
            (
                '        own["private_limit"] = cfg.private_limit + canaries',
                '        own["private_limit"] = cfg.private_limit',
            ),
        ),
        ("tests/test_audit_power.py::test_every_canary_votes_whatever_m",),
    ),
    "audit-default-64-canaries": Mutant(
        "the audit's default canary count is fixed at 64 (its best bound 2.32 cannot refute epsilon 4)",
        "wasp_vllm/ops/audit.py",
        (("    canaries: int | None = None\n", "    canaries: int | None = 64\n"),),
        ("tests/test_audit_power.py::test_the_default_canary_count_can_refute_the_claim",),
    ),
    "private-embedding-timed-as-startup": Mutant(
        "the private embedding's time booked as the embedder's public start-up",
        "wasp_vllm/pipeline/loop.py",
        (('self._timed("private:embedding", encode_each', 'self._timed("startup:embedder", encode_each'),),
        ("tests/test_private_timing.py",),
    ),
    "dry-run-prints-private-row-count": Mutant(
        "the dry run prints the private file's row count",
        "wasp_vllm/pipeline/estimate.py",
        (
            (
                '        f"--private; the records that vote: {where.selection}"',
                '        f"--private ({sum(1 for _ in open(cfg.private)) - 1} records); the records that vote: "\n'
                '        f"{where.selection}"',
            ),
        ),
        ("tests/test_dry_run.py::test_the_dry_run_on_a_real_private_file_does_not_depend_on_its_size",),
    ),
}


def _plant(mutant: Mutant, scratch: Path) -> None:
    for folder in ("wasp_vllm", "tests"):
        shutil.copytree(ROOT / folder, scratch / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", scratch / "pyproject.toml")
    for edit in mutant.edits:
        file, old, new = edit if len(edit) == 3 else (mutant.file, *edit)
        path = scratch / file
        text = path.read_text()
        assert text.count(old) == 1, f"the code this mutant changes was rewritten (not found): {old!r}"
        path.write_text(text.replace(old, new))


@pytest.mark.parametrize("name", list(MUTANTS))
def test_the_mutant_is_caught(name, tmp_path):
    mutant = MUTANTS[name]
    _plant(mutant, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # cwd first on sys.path: the scratch copy shadows the installed package
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, f"mutant {name} survived ({mutant.why}):\n{proc.stdout[-2000:]}"

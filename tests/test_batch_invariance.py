"""One record changes only its own vote, or its own teacher, bitwise (issue 21, item 8).

Padded batches make every row's numbers depend, in their last bits, on the batch's longest input:
one private record more or less could then move *other* records' embeddings (and flip a near-tie
in their votes), or the public prompt's distribution in Hot PATE (whose fallback tokens are spent
as public).  The doubles here exaggerate that dependence so that it shows in every bit:
``PaddedBatchEmbedderForTests`` and ``PaddedBatchStubForTests`` scale each row by the length of
the longest input of their batch.  The slow tests check the real embedder and the real LM.
"""

from __future__ import annotations

import numpy as np
import pytest

import wasp_vllm.pipeline.loop
from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests
from tests.test_hotpate import CANARY, StubSource
from tests.test_noise import config, write_private
from wasp_vllm.engines.embedder import encode_each
from wasp_vllm.hotpate import run_hotpate
from wasp_vllm.pipeline import Run, prepare


class PaddedBatchEmbedderForTests(HashEmbedderForTests):
    """Hash embeddings scaled by the batch's longest text: what padding does, exaggerated."""

    def encode(self, texts):
        out = super().encode(texts)
        longest = max((len(t) for t in texts), default=0)
        return (out * np.float32(1.0 + 1e-3 * longest)).astype(np.float32)


class PaddedBatchStubForTests(StubSource):
    """A stub LM whose rows all depend on the longest prompt of the batch they were built in."""

    def __init__(self, prompts, vocab: int = 16) -> None:
        super().__init__(prompts, vocab)
        longest = max(len(p) for p in prompts)
        self._base = self._base * (1.0 + (longest % 13) * np.arange(vocab) / 4.0)


def _texts(n: int = 12) -> list[str]:
    return [f"record {i} " + "word " * (i % 4) for i in range(n)] + ["the longest record " * 20]


def test_each_private_embedding_depends_on_its_record_alone():
    embedder = PaddedBatchEmbedderForTests()
    texts = _texts()
    with_longest, without = encode_each(embedder, texts), encode_each(embedder, texts[:-1])
    assert with_longest[:-1].tobytes() == without.tobytes()
    # the double does what a padded batch does: batched, the others' embeddings would move
    assert embedder.encode(texts)[:-1].tobytes() != embedder.encode(texts[:-1]).tobytes()


def test_a_run_embeds_the_records_that_vote_one_at_a_time(tmp_path, monkeypatch):
    """The voters' embeddings of the records two neighbouring files share are bitwise equal."""
    seen: list[np.ndarray] = []
    real = wasp_vllm.pipeline.loop.Voters

    def spy(embeddings, labels, parties):
        seen.append(np.asarray(embeddings).copy())
        return real(embeddings, labels, parties)

    monkeypatch.setattr(wasp_vllm.pipeline.loop, "Voters", spy)
    without = write_private(tmp_path / "without.csv", n=20)
    with_long = tmp_path / "with.csv"  # the same records and a long one: it would set the padding
    with_long.write_text(without.read_text() + "very long " * 30 + "record,positive\n")
    by_text = []
    for path in (with_long, without):
        ctx = prepare(config(path, noise_seed=1))
        Run(ctx, tmp_path / f"out-{path.stem}", engine_factory=lambda n, _c: FakeEngineForUnitTests(n),
            embedder=PaddedBatchEmbedderForTests()).execute()  # fmt: skip
        by_text.append({t: row.tobytes() for t, row in zip(ctx.private.texts, seen[-1], strict=True)})
    assert len(by_text[0]) == len(by_text[1]) + 1
    assert all(by_text[0][t] == row for t, row in by_text[1].items())


def _fallback_only(texts: list[str], labels: list[str], factory) -> list[str]:
    """Records of a run in which no private call is affordable: every token is a public fallback."""
    table, report = run_hotpate(
        texts, labels, ["good", "bad"], teachers=4, max_tokens=6, n_samples=4, epsilon=0.05,
        delta=1e-5, seed=3, source_factory=factory,
    )  # fmt: skip
    assert report.tokens_private == 0 and report.tokens_fallback > 0
    return table.column("text").to_pylist()


def test_hot_pate_fallback_tokens_do_not_depend_on_a_private_prompts_length():
    texts = [f"{lab} review {i} {CANARY}" for lab in ("good", "bad") for i in range(8)]
    labels = ["good"] * 8 + ["bad"] * 8
    longer = [texts[0] + " and a much longer tail" * 12, *texts[1:]]
    first = _fallback_only(texts, labels, PaddedBatchStubForTests)
    assert first == _fallback_only(longer, labels, PaddedBatchStubForTests)


def test_hot_pate_never_batches_the_public_prompt_with_teacher_prompts():
    calls: list[list[str]] = []

    def factory(prompts):
        calls.append(list(prompts))
        return StubSource(prompts)

    texts = [f"review {i}" for i in range(8)]
    _fallback_only(texts, ["good", "bad"] * 4, factory)
    assert calls and {len(c) for c in calls} == {1, 4}  # the public prompt alone; the 4 teachers


def test_transformers_teachers_are_padded_to_a_length_from_public_settings(monkeypatch):
    """The run's factory pads every teacher batch to one length computed before any private prompt."""
    import wasp_vllm.hotpate.generate as generate
    from wasp_vllm.hotpate.settings import HotPateSettings

    lengths: list[tuple[list[str], int, int]] = []
    built: list[int | None] = []
    monkeypatch.setattr(generate, "load_lm", lambda *a: type("LM", (), {"name": "stub"})())

    def public_pad_length(lm, skeletons, k, chars):
        lengths.append((skeletons, k, chars))
        return 321

    monkeypatch.setattr(generate, "public_pad_length", public_pad_length)
    monkeypatch.setattr(generate, "TeacherEnsembleLM", lambda lm, prompts, **kw: built.append(kw["pad_to"]))
    run = HotPateSettings(
        n_samples=4, epsilon=1.0, delta=1e-5, teachers=4, task="drugs", max_example_chars=120
    )
    factory, _ = generate._source_factory(generate.TeacherModel("smollm2", "hf"), run, ["good", "bad"])
    factory(["private prompt one", "private prompt two"])
    factory(["another label's prompts"])
    assert built == [321, 321]
    skeletons, k, chars = lengths[0]
    assert len(lengths) == 1 and chars == 120 and k == run.examples_shown()
    assert ['"good"' in skeletons[0], '"bad"' in skeletons[1]] == [True, True]


@pytest.mark.slow
def test_the_real_embedder_gives_each_record_the_same_bits_with_or_without_another(embedder):
    texts = [
        "Works well, no side effects.",
        "It made me dizzy for a week and I stopped after ten days; my doctor switched me.",
        "Fine.",
        "After two months the headaches are gone " * 12,  # the longest: it sets a batch's padding
    ]
    alone = encode_each(embedder, texts)
    assert alone[:-1].tobytes() == encode_each(embedder, texts[:-1]).tobytes()
    assert np.allclose(alone, embedder.encode(texts), atol=1e-5)  # the same embeddings, up to rounding


@pytest.mark.slow
def test_the_public_rows_distribution_does_not_depend_on_a_teacher_prompts_length(smollm2_fp32):
    from wasp_vllm.hotpate.teachers import TeacherEnsembleLM, WithPublicRow

    lm = smollm2_fp32  # SmolLM2 in float32, loaded once for this file's two tests (conftest)
    public = "Write a short patient review of a drug."
    short = ["Review: it helped.", "Review: no effect."]
    long = ["Review: it helped. " + "It really did help with the pain every single day. " * 8, short[1]]

    def public_rows(teachers: list[str]) -> list[bytes]:
        source = WithPublicRow(TeacherEnsembleLM(lm, teachers), TeacherEnsembleLM(lm, [public]))
        rows = [source.next_distributions()[-1].tobytes()]
        for token in source.encode(' "It'):
            source.append(token)
            rows.append(source.next_distributions()[-1].tobytes())
        return rows

    assert public_rows(short) == public_rows(long)


@pytest.mark.slow
def test_each_teachers_distribution_depends_on_its_own_prompt_alone(smollm2_fp32):
    """Teachers padded to the public length: a longer record in one teacher moves no other row's bits.

    Padded to the batch's longest prompt instead (the bug planted once: ``pad_to=None``), the other
    rows moved by about 1e-6 on this CPU.
    """
    from wasp_vllm.hotpate.prompts import TEACHER_TEMPLATE, teacher_skeleton
    from wasp_vllm.hotpate.teachers import (
        TeacherEnsembleLM,
        encode_prompts,
        format_prompts,
        public_pad_length,
    )

    lm = smollm2_fp32
    task, chars = "patient review of a drug", 300
    pad_to = public_pad_length(lm, [teacher_skeleton(task, "positive", 1)], 1, chars)
    records = ["It helped.", "No effect at all for me.", "Fine, a bit of nausea."]
    longer = [records[0] + " The headaches were gone after two weeks and stayed gone." * 5, *records[1:]]

    def rows(texts: list[str]) -> tuple[np.ndarray, int]:
        teachers = [TEACHER_TEMPLATE.format(task=task, label="positive", examples=f"1. {t}") for t in texts]
        formatted = format_prompts(lm.tokenizer, teachers, lm.chat)
        longest = max(map(len, encode_prompts(lm.tokenizer, formatted, lm.chat)))
        ensemble = TeacherEnsembleLM(lm, teachers, pad_to=pad_to)
        out = [ensemble.next_distributions()]
        for token in ensemble.encode(' "It'):
            ensemble.append(token)
            out.append(ensemble.next_distributions())
        return np.stack(out), longest

    (short, short_longest), (long, long_longest) = rows(records), rows(longer)
    assert long_longest > short_longest  # the longer record sets the batch's longest prompt
    assert long_longest <= pad_to  # and the public length still holds it: nothing cut
    assert short[:, 1:].tobytes() == long[:, 1:].tobytes()  # the other teachers, bitwise
    assert short[:, 0].tobytes() != long[:, 0].tobytes()  # its own teacher did change

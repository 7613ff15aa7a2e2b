"""The audit's made-up words: pronounceable, and kept apart from each other by a few edits.

A canary's signature is a handful of words no PLM knows.  Each word is at least
:data:`MIN_SEPARATION` edits from every other canary's, so a PLM that copies one canary and
misspells a letter never echoes another (a false "in" guess that would cost the attack its power).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

#: Syllables of the made-up words: pronounceable, so a PLM copies them as words.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "sk")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou")
#: Syllables per made-up word.  Four, not three: a PLM shown made-up words invents more in their
#: style, and under the tests' planted leak SmolLM2 wrote an excluded canary's three-syllable word
#: ("pourofou") of its own accord, a false "in" guess that costs the attack its power.
SYLLABLES = 4
#: Edits between any two canaries' words: a one-letter misspelling of one is still two from another.
MIN_SEPARATION = 3


def made_up_word(rng: random.Random, syllables: int = SYLLABLES) -> str:
    """A pronounceable made-up word of ``syllables`` onset + nucleus pairs."""
    return "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) for _ in range(syllables))


class SeparatedWords:
    """Words taken so far, each at least ``separation`` edits from every other.

    Every taken word is indexed under each way of leaving out up to ``separation - 1`` of its
    letters. Two words that close share such a key (each edit leaves out at most one letter on each
    side), so a new word is compared only with the taken words that share one. Comparing it with
    every taken word instead took 26 s for the audit's default 373 canaries (2,238 words); this
    takes 0.3 s and admits the same words.
    """

    def __init__(self, separation: int) -> None:
        self.near = separation - 1
        self._index: dict[str, list[str]] = {}

    def admits(self, words: Sequence[str]) -> bool:
        """Whether every one of ``words`` keeps its distance from the taken words and the others."""
        return not any(
            within(word, other, self.near)
            for i, word in enumerate(words)
            for other in [*self.sharing_a_key(word), *words[:i]]
        )

    def add(self, words: Sequence[str]) -> None:
        for word in words:
            for key in left_out(word, self.near):
                self._index.setdefault(key, []).append(word)

    def sharing_a_key(self, word: str) -> set[str]:
        """The taken words that share a key with ``word``: every taken word ``near`` it is here."""
        return {other for key in left_out(word, self.near) for other in self._index.get(key, ())}


def left_out(word: str, letters: int) -> set[str]:
    """The word with up to ``letters`` of its letters left out, the word itself included."""
    keys, shorter = {word}, {word}
    for _ in range(letters):
        shorter = {w[:i] + w[i + 1 :] for w in shorter for i in range(len(w))}
        keys |= shorter
    return keys


def within(a: str, b: str, edits: int) -> bool:
    """Whether ``a`` and ``b`` are at most ``edits`` insertions, deletions or substitutions apart."""
    if abs(len(a) - len(b)) > edits:
        return False
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
        if min(row) > edits:
            return False  # the distance never falls again
    return row[-1] <= edits

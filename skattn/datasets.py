"""Datasets for sequence-to-sequence tasks, generated or shipped with the package (no downloads).

- :func:`make_reversal`: random strings and their reversals (the seeds' digit-reversal task).
- :func:`make_number_words`: numbers in digits and in words (``"42" -> "forty-two"``).
- :func:`load_cmudict`: the standard CMUdict 0.7b grapheme-to-phoneme train/test split, packaged
  in ``skattn/data`` (see its README for the license), with or without CMUdict's stress marks;
  :func:`strip_stress`, :func:`group_pronunciations` and :func:`split_by_word` for evaluating
  against several references and for a development set.

``random_state`` follows scikit-learn: ``None``, an int seed, or a NumPy ``Generator`` /
``RandomState``; the same int gives the same data.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from importlib import resources
from numbers import Integral, Real

import numpy as np

from skattn.core.checks import check_bool
from skattn.core.items import ordered_items

__all__ = [
    "group_pronunciations",
    "load_cmudict",
    "make_number_words",
    "make_reversal",
    "split_by_word",
    "strip_stress",
]

CMUDICT_SPLITS = ("train", "test")

# ARPAbet's vowels: the phonemes CMUdict marks with a stress digit (0 none, 1 primary, 2 secondary).
ARPABET_VOWELS = frozenset(
    ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
)


# ---------------------------------------------------------------- validation helpers


# The largest int64: NumPy's bound for random integers and array sizes. Past it NumPy's own
# errors ("high is out of bounds for int64") would not name the parameter.
_INT64_MAX = int(np.iinfo(np.int64).max)


def _check_int(value: object, name: str, minimum: int, maximum: int = _INT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value > maximum:
        raise ValueError(f"{name} must be an int in [{minimum}, {maximum}], got {value!r}")
    return int(value)


def _rng(random_state: None | int | np.random.Generator | np.random.RandomState):
    """A NumPy Generator from a scikit-learn-style ``random_state``."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(np.iinfo(np.int32).max))
    if random_state is None or (
        isinstance(random_state, Integral)
        and not isinstance(random_state, bool)
        and random_state >= 0
    ):
        return np.random.default_rng(random_state)
    raise ValueError(
        "random_state must be None, an int >= 0, or a NumPy Generator/RandomState, "
        f"got {random_state!r}"
    )


# ---------------------------------------------------------------- generated tasks


#: The most symbols :func:`make_reversal` draws (``n_samples * max_length``): 8 bytes each
#: while drawn, 16 GiB at this bound.
MAX_REVERSAL_SYMBOLS = 2**31


def make_reversal(
    n_samples: int,
    min_length: int,
    max_length: int,
    alphabet: str = "0123456789",
    random_state: None | int | np.random.Generator | np.random.RandomState = None,
) -> tuple[list[str], list[str]]:
    """Random strings and their reversals: ``"3141" -> "1413"``.

    Parameters
    ----------
    n_samples : int
        Number of pairs (>= 1).
    min_length, max_length : int
        Each string's length is drawn uniformly from ``[min_length, max_length]`` (inclusive;
        ``0 <= min_length <= max_length``).
    alphabet : str, default="0123456789"
        The characters, each drawn uniformly and independently.
    random_state : None, int, Generator or RandomState, default=None

    Returns
    -------
    X : list of str, length n_samples
    y : list of str, length n_samples
        ``y[i] == X[i][::-1]``.

    Examples
    --------
    >>> X, y = make_reversal(3, min_length=4, max_length=6, random_state=0)
    >>> all(t == s[::-1] for s, t in zip(X, y))
    True
    """
    n_samples = _check_int(n_samples, "n_samples", 1)
    min_length = _check_int(min_length, "min_length", 0)
    max_length = _check_int(max_length, "max_length", 0)
    if max_length < min_length:
        raise ValueError(f"max_length must be >= min_length, got {max_length} < {min_length}")
    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"alphabet must be a non-empty str, got {alphabet!r}")
    if n_samples * max_length > MAX_REVERSAL_SYMBOLS:  # (int64 sums wrapped past 2**63: '')
        raise ValueError(
            f"n_samples * max_length must be at most {MAX_REVERSAL_SYMBOLS} symbols, got "
            f"{n_samples} * {max_length}"
        )
    rng = _rng(random_state)
    lengths = rng.integers(min_length, max_length, endpoint=True, size=n_samples)  # (N,)
    symbols = rng.integers(len(alphabet), size=int(lengths.sum()))  # all strings, concatenated
    text = "".join(alphabet[i] for i in symbols)
    ends = np.cumsum(lengths)  # (N,)
    X = [text[end - n : end] for n, end in zip(lengths.tolist(), ends.tolist(), strict=True)]
    return X, [x[::-1] for x in X]


def make_number_words(
    n_samples: int,
    min_value: int = 0,
    max_value: int = 9999,
    lang: str = "en",
    to: str = "cardinal",
    random_state: None | int | np.random.Generator | np.random.RandomState = None,
) -> tuple[list[str], list[str]]:
    """Numbers written in digits and in words, through ``num2words``: ``"42" -> "forty-two"``.

    Parameters
    ----------
    n_samples : int
        Number of pairs (>= 1); values are drawn uniformly, with replacement.
    min_value, max_value : int, default=0, 9999
        The inclusive range of the values (``0 <= min_value <= max_value <= 2**63 - 1``, the
        largest int64). num2words' languages reach different sizes (en_IN below 10^11; Polish
        ordinals start at 1): a value it cannot write is a ``ValueError`` naming it.
    lang : str, default="en"
        Any language code that num2words knows (``"en"``, ``"fr"``, ``"de"``, ...).
    to : {"cardinal", "ordinal", "year"}, default="cardinal"
        The written form: ``"forty-two"``, ``"forty-second"`` or a year reading.
    random_state : None, int, Generator or RandomState, default=None

    Returns
    -------
    X : list of str
        The numbers in digits.
    y : list of str
        The numbers in words.

    Examples
    --------
    >>> make_number_words(1, min_value=42, max_value=42)
    (['42'], ['forty-two'])
    """
    from num2words import CONVERTER_CLASSES, num2words

    n_samples = _check_int(n_samples, "n_samples", 1)
    min_value = _check_int(min_value, "min_value", 0)
    max_value = _check_int(max_value, "max_value", 0)
    if max_value < min_value:
        raise ValueError(f"max_value must be >= min_value, got {max_value} < {min_value}")
    if not isinstance(lang, str) or lang not in CONVERTER_CLASSES:
        raise ValueError(f"lang must be one of {sorted(CONVERTER_CLASSES)}, got {lang!r}")
    forms = ("cardinal", "ordinal", "year")
    if not isinstance(to, str) or to not in forms:
        raise ValueError(f"to must be one of {list(forms)}, got {to!r}")

    def words(value: int) -> str:
        # num2words lacks some forms of some languages (Czech ordinals, Vietnamese years), and
        # its languages reach different ranges (Polish ordinals not 0, en_IN below 10^11),
        # each with its own exception
        try:
            return num2words(value, lang=lang, to=to)
        except Exception as exc:  # noqa: BLE001 - re-raised as the ValueError that names why
            raise ValueError(
                f"to={to!r} is not supported for lang={lang!r} by num2words at {value} "
                f"({type(exc).__name__}: {exc}); choose a range it can write (min_value, "
                "max_value), or another lang or to"
            ) from None

    words(min_value)  # the two ends first: a range past the language's reach fails at once
    words(max_value)
    values = _rng(random_state).integers(min_value, max_value, endpoint=True, size=n_samples)
    values = [int(v) for v in values]
    return [str(v) for v in values], [words(v) for v in values]


# ---------------------------------------------------------------- CMUdict


def _read_cmudict(split: str) -> list[tuple[str, tuple[str, ...]]]:
    path = resources.files("skattn").joinpath("data", f"cmudict-0.7b.{split}.gz")
    entries = []
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="ascii") as lines:
        for number, line in enumerate(lines, start=1):
            word, sep, phonemes = line.rstrip("\n").partition("  ")
            if not sep or not word or not phonemes.split():
                raise ValueError(f"malformed line {number} in cmudict-0.7b.{split}: {line!r}")
            entries.append((word, tuple(phonemes.split())))
    return entries


def _read_cmudict_stress(split: str, entries: list) -> list[tuple[str, tuple[str, ...]]]:
    """The split's lines with their vowels' stress digits put back; see the data's README.

    ``cmudict-0.7b.{split}.stress.gz`` has one line per line of the split: the stress digits of
    its vowels (``01``), several space-separated when CMUdict stresses the same phonemes more
    than one way, or nothing when it has no stressed form of the line (the line is left out).
    """
    path = resources.files("skattn").joinpath("data", f"cmudict-0.7b.{split}.stress.gz")
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="ascii") as lines:
        marks = lines.read().split("\n")[:-1]
    if len(marks) != len(entries):
        raise ValueError(f"cmudict-0.7b.{split}.stress has {len(marks)} lines, not {len(entries)}")
    stressed = []
    for number, ((word, phonemes), line) in enumerate(zip(entries, marks, strict=True), start=1):
        vowels = [i for i, phoneme in enumerate(phonemes) if phoneme in ARPABET_VOWELS]
        for digits in line.split():
            if len(digits) != len(vowels) or not set(digits) <= set("012"):
                raise ValueError(f"malformed line {number} in cmudict-0.7b.{split}.stress")
            marked = list(phonemes)
            for i, digit in zip(vowels, digits, strict=True):
                marked[i] += digit
            stressed.append((word, tuple(marked)))
    return stressed


def load_cmudict(
    split: str = "train", *, lowercase: bool = False, stress: bool = False
) -> tuple[list[str], list[list[str]]]:
    """The standard CMUdict 0.7b grapheme-to-phoneme split, shipped with the package.

    The split of Yao & Zweig (2015) and later published G2P results: ``"train"`` holds 114,399
    pronunciations of 106,794 distinct words, ``"test"`` 12,855 of 11,994. Stress is removed.
    A word with several pronunciations appears once per pronunciation (adjacent lines), and all
    of a word's pronunciations lie on the same side of the split. Take a development set out of
    ``"train"`` with :func:`split_by_word`; never tune on ``"test"``.

    Parameters
    ----------
    split : {"train", "test"}, default="train"
    lowercase : bool, default=False
        Words are upper-case as in the dictionary (``"CAUSE"``, ``"'COURSE"``); ``True``
        lower-cases them. Phonemes stay ARPAbet upper-case.
    stress : bool, default=False
        ``True`` marks every vowel with CMUdict's stress digit (``"AH0"``, ``"OW1"``;
        :func:`strip_stress` takes them off). The split's lines are stressed from a later
        CMUdict (the ``cmudict`` package's): a line whose phonemes it no longer gives with
        stress is left out (1,011 of the training lines, 122 of the test lines), so
        ``"train"`` holds 113,397 stressed lines of 106,052 words and ``"test"`` 12,734 of
        11,915. The words are the same split's: train on stress, score without it
        (:func:`strip_stress`), and the published figures still compare.

    Returns
    -------
    words : list of str
        The grapheme sequences, one per line (upper-case letters and ``'``, as the split
        spells them).
    pronunciations : list of list of str
        The ARPAbet phonemes of each line, e.g. ``["K", "AH", "Z"]``.

    Examples
    --------
    >>> words, prons = load_cmudict("test")
    >>> len(words), len(set(words))
    (12855, 11994)
    """
    if not isinstance(split, str) or split not in CMUDICT_SPLITS:
        raise ValueError(f"split must be one of {list(CMUDICT_SPLITS)}, got {split!r}")
    lowercase = check_bool(lowercase, "lowercase")
    entries = _read_cmudict(split)
    if check_bool(stress, "stress"):
        entries = _read_cmudict_stress(split, entries)
    words = [w.lower() if lowercase else w for w, _ in entries]
    return words, [list(p) for _, p in entries]


def strip_stress(pronunciations: Sequence[Sequence[str]]) -> list[list[str]]:
    """Take CMUdict's stress digits off the vowels: ``[["HH", "AH0", "L", "OW1"]]`` ->
    ``[["HH", "AH", "L", "OW"]]``. Phonemes without a digit pass as they are.

    Examples
    --------
    >>> strip_stress([["P", "R", "AA1", "JH", "EH0", "K", "T"]])
    [['P', 'R', 'AA', 'JH', 'EH', 'K', 'T']]
    """
    pronunciations = _token_lists(pronunciations)
    return [[_unstressed(phoneme) for phoneme in pronunciation] for pronunciation in pronunciations]


def _token_lists(pronunciations: Sequence[Sequence[str]]) -> list:
    """``pronunciations`` as a list, each item checked to be a token list: a list, tuple or array
    of str (``["K", "AH"]``)."""
    pronunciations = ordered_items(pronunciations, "pronunciations", "token list")
    for index, pronunciation in enumerate(pronunciations):
        if isinstance(pronunciation, str):  # list("K AH") would be characters
            raise ValueError("pronunciations must be token lists (['K', 'AH']), not strings")
        if not (
            isinstance(pronunciation, list | tuple | np.ndarray)
            and all(isinstance(t, str) for t in pronunciation)
        ):
            raise ValueError(
                f"pronunciations[{index}] must be a token list (['K', 'AH']), "
                f"got {pronunciation!r:.60}"
            )
    return pronunciations


def _unstressed(phoneme: str) -> str:
    if phoneme[-1:] in ("0", "1", "2") and phoneme[:-1] in ARPABET_VOWELS:
        return phoneme[:-1]
    return phoneme


def group_pronunciations(
    words: Sequence[str], pronunciations: Sequence[Sequence[str]]
) -> tuple[list[str], list[list[list[str]]]]:
    """Gather all pronunciations of each word: the references for "matches any" metrics.

    Parameters
    ----------
    words : sequence of str
        One word per entry, repeated for each pronunciation.
    pronunciations : sequence of token lists
        Aligned with ``words``.

    Returns
    -------
    unique_words : list of str
        Each word once, in first-seen order.
    references : list of list of list of str
        ``references[i]`` holds every distinct pronunciation of ``unique_words[i]`` in
        first-seen order; the form ``skattn.metrics`` takes for several references.

    Examples
    --------
    >>> group_pronunciations(["A", "B", "A"], [["AH"], ["B", "IY"], ["EY"]])
    (['A', 'B'], [[['AH'], ['EY']], [['B', 'IY']]])
    """
    words = ordered_items(words, "words")
    pronunciations = _token_lists(pronunciations)
    if len(words) != len(pronunciations):
        raise ValueError(
            "pronunciations must have as many items as words, "
            f"got {len(pronunciations)} and {len(words)}"
        )
    for index, word in enumerate(words):
        if not isinstance(word, str):
            raise ValueError(f"words[{index}] must be a str, got {word!r:.60}")
    grouped: dict[str, list[list[str]]] = {}
    for word, pronunciation in zip(words, pronunciations, strict=True):
        references = grouped.setdefault(word, [])
        if list(pronunciation) not in references:
            references.append(list(pronunciation))
    return list(grouped), list(grouped.values())


def split_by_word(
    X: Sequence[str],
    y: Sequence,
    dev_size: float | int = 0.05,
    random_state: None | int | np.random.Generator | np.random.RandomState = None,
) -> tuple[list[str], list[str], list, list]:
    """Split off a development set by distinct word, never by line.

    All entries of a word (all its pronunciations) land on the same side, so the development
    set measures generalisation to unseen words, as the CMUdict test split does.

    Parameters
    ----------
    X : sequence of str
        The words, repeated once per entry.
    y : sequence
        The targets, aligned with ``X``.
    dev_size : float or int, default=0.05
        A float in (0, 1): the fraction of distinct words held out; an int >= 1: their number.
    random_state : None, int, Generator or RandomState, default=None

    Returns
    -------
    X_train, X_dev, y_train, y_dev : list
        In the order of ``sklearn.model_selection.train_test_split``; entries keep their
        original order within each side.

    Examples
    --------
    >>> X_tr, X_dev, y_tr, y_dev = split_by_word(["A", "A", "B", "C"], [1, 2, 3, 4], 1, 0)
    >>> len(set(X_tr) & set(X_dev)), len(set(X_dev))
    (0, 1)
    """
    X, y = ordered_items(X, "X"), ordered_items(y, "y", "target")  # a set's order is random
    if len(X) != len(y):
        raise ValueError(f"y must have as many items as X, got {len(y)} and {len(X)}")
    for index, word in enumerate(X):
        if not isinstance(word, str):  # the split is by distinct word
            raise ValueError(f"X[{index}] must be a str (a word), got {word!r:.60}")
    unique = list(dict.fromkeys(X))
    n_words = len(unique)
    if isinstance(dev_size, Real) and not isinstance(dev_size, (bool, Integral)):
        if not 0 < dev_size < 1:
            raise ValueError(f"dev_size must be in (0, 1) as a fraction, got {dev_size!r}")
        n_dev = int(round(dev_size * n_words))
    else:
        n_dev = _check_int(dev_size, "dev_size", 1)
    if not 1 <= n_dev < n_words:
        raise ValueError(
            f"dev_size must leave at least one word on each side of {n_words} distinct words, "
            f"got {dev_size!r}"
        )
    chosen = _rng(random_state).choice(n_words, size=n_dev, replace=False)
    dev_words = {unique[i] for i in chosen}
    in_dev = [x in dev_words for x in X]
    return (
        [x for x, d in zip(X, in_dev, strict=True) if not d],
        [x for x, d in zip(X, in_dev, strict=True) if d],
        [t for t, d in zip(y, in_dev, strict=True) if not d],
        [t for t, d in zip(y, in_dev, strict=True) if d],
    )

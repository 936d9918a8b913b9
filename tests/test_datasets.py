import numpy as np
import pytest

from skattn.datasets import (
    group_pronunciations,
    load_cmudict,
    make_number_words,
    make_reversal,
    split_by_word,
    strip_stress,
)
from skattn.metrics import phoneme_error_rate, word_error_rate


@pytest.fixture(scope="module")
def cmudict_train():
    return load_cmudict("train")


@pytest.fixture(scope="module")
def cmudict_test():
    return load_cmudict("test")


def test_make_reversal_pairs_and_lengths():
    X, y = make_reversal(200, min_length=3, max_length=7, random_state=0)
    assert len(X) == len(y) == 200
    assert all(t == s[::-1] for s, t in zip(X, y, strict=True))
    lengths = {len(s) for s in X}
    assert lengths == set(range(3, 8))  # both ends reached with 200 draws
    assert set("".join(X)) <= set("0123456789")


def test_make_reversal_alphabet_and_fixed_length():
    X, y = make_reversal(50, min_length=8, max_length=8, alphabet="ab", random_state=1)
    assert {len(s) for s in X} == {8}
    assert set("".join(X)) == {"a", "b"}


def test_make_reversal_seeded():
    assert make_reversal(20, 1, 9, random_state=3) == make_reversal(20, 1, 9, random_state=3)
    assert make_reversal(20, 1, 9, random_state=3) != make_reversal(20, 1, 9, random_state=4)
    rng = np.random.default_rng(5)
    assert (
        make_reversal(5, 2, 4, random_state=rng)[0] != make_reversal(5, 2, 4, random_state=rng)[0]
    )
    X, _ = make_reversal(5, 2, 4, random_state=np.random.RandomState(0))
    assert len(X) == 5


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_samples": 0}, "n_samples"),
        ({"n_samples": 2.5}, "n_samples"),
        ({"min_length": -1}, "min_length"),
        ({"max_length": 1, "min_length": 3}, "max_length"),
        ({"alphabet": ""}, "alphabet"),
        ({"alphabet": ["a", "b"]}, "alphabet"),
        ({"random_state": "seed"}, "random_state"),
        ({"max_length": 10**20}, r"max_length must be an int in \[0, 9223372036854775807\]"),
        ({"n_samples": 10**20}, "n_samples"),  # NumPy: "Maximum allowed dimension exceeded"
        # int64 sums of the lengths wrapped past 2**63: four empty strings, no error
        ({"n_samples": 4, "min_length": 2**62, "max_length": 2**62}, r"n_samples \* max_length"),
        ({"n_samples": 3, "min_length": 2**62, "max_length": 2**62}, r"n_samples \* max_length"),
    ],
)
def test_make_reversal_validation(kwargs, name):
    args = {"n_samples": 3, "min_length": 1, "max_length": 4, **kwargs}
    with pytest.raises(ValueError, match=name):
        make_reversal(**args)


def test_make_number_words():
    assert make_number_words(1, min_value=42, max_value=42) == (["42"], ["forty-two"])
    X, y = make_number_words(30, max_value=999, random_state=0)
    assert all(0 <= int(x) <= 999 for x in X)
    assert y[X.index(X[0])] == y[0]
    assert make_number_words(1, 3, 3, to="ordinal") == (["3"], ["third"])
    assert make_number_words(1, 42, 42, lang="fr") == (["42"], ["quarante-deux"])
    assert make_number_words(10, random_state=7) == make_number_words(10, random_state=7)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"lang": "xx"}, "lang"),
        ({"to": "currency"}, "to"),
        ({"min_value": -1}, "min_value"),
        ({"min_value": 10, "max_value": 5}, "max_value"),
        ({"n_samples": -3}, "n_samples"),
        # past int64 NumPy says only "high is out of bounds for int64"
        ({"max_value": 10**20}, r"max_value must be an int in \[0, 9223372036854775807\]"),
        ({"max_value": 2**63}, "max_value"),
        ({"min_value": 10**20, "max_value": 10**20}, "min_value"),
        ({"n_samples": 10**20}, "n_samples"),
    ],
)
def test_make_number_words_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_number_words(**{"n_samples": 2, **kwargs})


def test_make_number_words_largest_int64():
    top = 2**63 - 1
    assert make_number_words(1, top, top)[0] == [str(top)]
    X, _ = make_number_words(5, 0, top, random_state=0)
    assert all(0 <= int(x) <= top for x in X)
    with pytest.raises(ValueError, match="max_value"):
        make_number_words(1, top, top + 1)


def test_cmudict_counts(cmudict_train, cmudict_test):
    words, prons = cmudict_train
    assert len(words) == len(prons) == 114_399
    assert len(set(words)) == 106_794
    words, prons = cmudict_test
    assert len(words) == len(prons) == 12_855
    assert len(set(words)) == 11_994


def test_cmudict_standard_split_is_disjoint(cmudict_train, cmudict_test):
    assert not set(cmudict_train[0]) & set(cmudict_test[0])


def test_cmudict_format(cmudict_train):
    words, prons = cmudict_train
    assert words[0] == "'CAUSE" and prons[0] == ["K", "AH", "Z"]
    assert all(isinstance(p, list) and p for p in prons)
    phonemes = {ph for p in prons for ph in p}
    assert len(phonemes) == 39  # ARPAbet without stress
    assert not any(ch.isdigit() for ph in phonemes for ch in ph)


VOWELS = {"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW"}
CONSONANTS = set("B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split())


@pytest.mark.parametrize(
    ("split", "lines", "words"), [("train", 113_397, 106_052), ("test", 12_734, 11_915)]
)
def test_cmudict_with_stress_is_the_split_with_its_vowels_marked(split, lines, words):
    stressed_words, stressed = load_cmudict(split, stress=True)
    assert len(stressed_words) == len(stressed) == lines and len(set(stressed_words)) == words
    for pronunciation in stressed:  # every vowel marked 0, 1 or 2; nothing else marked
        for phoneme in pronunciation:
            assert (phoneme[:-1] in VOWELS and phoneme[-1] in "012") or phoneme in CONSONANTS
    # each stressed line is one of the split's lines of its word with the stress taken off
    plain = {}
    for word, pronunciation in zip(*load_cmudict(split), strict=True):
        plain.setdefault(word, []).append(pronunciation)
    for word, pronunciation in zip(stressed_words, strip_stress(stressed), strict=True):
        assert pronunciation in plain[word]


def test_cmudict_with_stress_worked_lines():
    words, prons = load_cmudict("train", stress=True)
    lines = {}
    for word, pronunciation in zip(words, prons, strict=True):
        lines.setdefault(word, []).append(" ".join(pronunciation))
    assert lines["HELLO"] == ["HH AH0 L OW1", "HH EH0 L OW1"]
    # 0.7b stressed ABSTRACT's one phoneme string two ways; the split has the line twice
    assert lines["ABSTRACT"] == ["AE0 B S T R AE1 K T", "AE1 B S T R AE2 K T"]
    # the later dictionary stresses PROJECT's repeated line one way only: one line left
    assert lines["PROJECT"] == ["P R AA1 JH EH0 K T"]
    assert (words[0], prons[0]) == ("'CAUSE", ["K", "AH0", "Z"])  # the file's first line


def test_cmudict_stress_must_be_a_bool():
    with pytest.raises(ValueError, match="stress"):
        load_cmudict("test", stress="yes")


def test_strip_stress():
    assert strip_stress([["HH", "AH0", "L", "OW1"], ["ER2"], []]) == [
        ["HH", "AH", "L", "OW"],
        ["ER"],
        [],
    ]
    assert strip_stress((("K", "AE", "T"),)) == [["K", "AE", "T"]]  # stressless: as it is
    assert strip_stress([["X1", "AH3", "1"]]) == [["X1", "AH3", "1"]]  # only a vowel's 0-2
    with pytest.raises(ValueError, match="pronunciations"):
        strip_stress(["HH AH0"])  # a string, not a token list
    with pytest.raises(ValueError, match="pronunciations"):
        strip_stress([["HH", 0]])


def test_cmudict_lowercase():
    words, _ = load_cmudict("test", lowercase=True)
    assert all(w == w.lower() for w in words)


def test_cmudict_bad_split():
    with pytest.raises(ValueError, match="split"):
        load_cmudict("dev")


def test_group_pronunciations(cmudict_test):
    words, refs = group_pronunciations(*cmudict_test)
    assert len(words) == len(refs) == 11_994
    # stress removal makes some pronunciations identical: each distinct one is kept once
    distinct = {(w, tuple(p)) for w, p in zip(*cmudict_test, strict=True)}
    assert sum(len(r) for r in refs) == len(distinct) < 12_855
    assert all(r and all(isinstance(p, list) for p in r) for r in refs)


def test_group_pronunciations_small():
    words, refs = group_pronunciations(["A", "B", "A", "A"], [["AH"], ["B"], ["EY"], ["AH"]])
    assert words == ["A", "B"]
    assert refs == [[["AH"], ["EY"]], [["B"]]]
    with pytest.raises(ValueError, match="pronunciations"):
        group_pronunciations(["A"], [])


def test_split_by_word_keeps_words_together(cmudict_train):
    words, prons = cmudict_train
    X_tr, X_dev, y_tr, y_dev = split_by_word(words, prons, dev_size=0.05, random_state=0)
    assert not set(X_tr) & set(X_dev)
    assert len(X_tr) + len(X_dev) == len(words)
    assert len(set(X_dev)) == round(0.05 * 106_794)
    # every pronunciation of a dev word went with it
    dev_words = set(X_dev)
    expected = {(w, tuple(p)) for w, p in zip(words, prons, strict=True) if w in dev_words}
    assert {(w, tuple(p)) for w, p in zip(X_dev, y_dev, strict=True)} == expected
    assert len(X_tr) == len(y_tr)


def test_split_by_word_seeded_and_sized():
    X = [w for w in "abcdefghij" for _ in range(2)]
    y = list(range(len(X)))
    first = split_by_word(X, y, dev_size=3, random_state=1)
    assert first == split_by_word(X, y, dev_size=3, random_state=1)
    assert len(set(first[1])) == 3 and len(first[1]) == 6
    assert sorted(first[2] + first[3]) == y


@pytest.mark.parametrize("dev_size", [0, 0.0, 1.0, 10, 1.5, True, "0.1"])
def test_split_by_word_bad_size(dev_size):
    X = list("abcdefghij")
    with pytest.raises(ValueError, match="dev_size"):
        split_by_word(X, X, dev_size=dev_size)


def test_split_by_word_mismatched_lengths():
    with pytest.raises(ValueError, match="y must have as many items as X, got 1 and 2"):
        split_by_word(["a", "b"], [1])


def test_grouped_references_make_any_pronunciation_right(cmudict_test):
    words, refs = group_pronunciations(*cmudict_test)
    last = [r[-1] for r in refs]
    assert word_error_rate(refs, last) == 0.0
    assert phoneme_error_rate(refs, last) == 0.0
    # dropping each word's last phoneme: every word wrong, PER = words / reference phonemes
    clipped = [r[0][:-1] for r in refs]
    assert word_error_rate(refs, clipped) == 1.0
    assert 0 < phoneme_error_rate(refs, clipped) < 0.5


def test_docstring_examples():
    import doctest

    import skattn.datasets

    result = doctest.testmod(skattn.datasets)
    assert result.attempted > 0 and result.failed == 0


def test_bad_inputs_of_the_generators_and_helpers_are_named():
    # num2words lacks some forms of some languages: a ValueError naming them, not its errors
    for lang, to in (("cs", "ordinal"), ("vi", "year"), ("ja", "year")):
        with pytest.raises(ValueError, match=rf"to='{to}' is not supported for lang='{lang}'"):
            make_number_words(2, lang=lang, to=to, random_state=0)
    with pytest.raises(ValueError, match="lang must be one of"):
        make_number_words(2, lang=["en"], random_state=0)
    for call in (
        lambda: make_reversal(3, 1, 3, random_state=-1),
        lambda: split_by_word(["a", "b"], [1, 2], 1, random_state=-1),
    ):
        with pytest.raises(ValueError, match="random_state must be None, an int >= 0"):
            call()
    with pytest.raises(ValueError, match="X must be a sequence"):  # a set's order is random
        split_by_word({"a", "b", "c"}, [1, 2, 3], 1, 0)
    with pytest.raises(ValueError, match="X must be a sequence"):
        split_by_word("abc", [1, 2, 3], 1, 0)
    with pytest.raises(ValueError, match="token lists"):  # list("K AH") would be characters
        group_pronunciations(["A"], ["K AH"])
    with pytest.raises(ValueError, match="lowercase must be True or False"):
        load_cmudict("test", lowercase="no")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(max_value=3000, lang="pl", to="ordinal"), r"lang='pl' by num2words at 0 \(Index"),
        (dict(max_value=10**11, lang="en_IN"), r"lang='en_IN' by num2words at 100000000000 \("),
        (dict(to=np.array(["cardinal", "x"])), "to must be one of"),
    ],
)
def test_number_words_past_a_languages_reach_is_a_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_number_words(5, **{"min_value": 0, "random_state": 0, **kwargs})


def test_cmudict_split_must_be_a_name():
    with pytest.raises(ValueError, match="split must be one of"):
        load_cmudict(np.array(["test"]))


@pytest.mark.parametrize(
    ("words", "pronunciations", "match"),
    [
        ([["A"]], [["AH"]], r"words\[0\] must be a str"),
        ([1, "1"], [["AH"], ["B"]], r"words\[0\] must be a str"),
        (["A"], [None], r"pronunciations\[0\] must be a token list"),
        (["A"], [5], r"pronunciations\[0\] must be a token list"),
        (["A"], [[["AH"]]], r"pronunciations\[0\] must be a token list"),
    ],
)
def test_group_pronunciations_names_a_bad_item(words, pronunciations, match):
    with pytest.raises(ValueError, match=match):
        group_pronunciations(words, pronunciations)


def test_split_by_word_needs_words():
    with pytest.raises(ValueError, match=r"X\[0\] must be a str"):
        split_by_word([["a", "b"], ["c"]], [1, 2], 1, 0)
    rows = np.array([["K", "AH"], ["B", "IY"]])
    assert group_pronunciations(["A", "B"], rows) == (["A", "B"], [[["K", "AH"]], [["B", "IY"]]])

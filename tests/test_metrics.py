import subprocess
import sys

import numpy as np
import pytest

from skattn import metrics
from skattn.core.text import tokenize
from skattn.metrics import (
    character_error_rate,
    corpus_bleu,
    edit_distance,
    exact_match,
    phoneme_error_rate,
    token_accuracy,
    token_error_rate,
    word_error_rate,
)


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("kitten", "sitting", 3),
        ("flaw", "lawn", 2),
        ("", "abc", 3),
        ("abc", "abc", 0),
        (["K", "AH", "Z"], ["K", "AO", "Z", "IH"], 2),
        (["AH", "M"], [], 2),
    ],
)
def test_edit_distance_known_values(a, b, distance):
    assert edit_distance(a, b) == distance
    assert edit_distance(b, a) == distance


def test_multi_character_tokens_are_single_symbols():
    # one phoneme "AH" is a different symbol from the two tokens "A", "H": 1 substitution + 1
    # insertion, where the strings "AH" and "AO" differ by one character substitution
    assert edit_distance(["AH"], ["A", "H"]) == 2
    assert edit_distance(["AH", "M"], ["AO", "M"]) == edit_distance("AHM", "AOM") == 1


def test_exact_match():
    assert exact_match(["abc", "abd", "x"], ["abc", "abc", "x"]) == pytest.approx(2 / 3)
    assert exact_match([["a", "b"]], ["ab"]) == 1.0  # token list vs str under "char"
    assert exact_match(["K AH Z"], [["K", "AH", "Z"]], tokenizer="space") == 1.0
    assert exact_match(["K AH Z"], [["K", "AH", "Z"]], tokenizer="char") == 0.0


def test_exact_match_with_several_references():
    y_true = [[["K", "AH", "Z"], ["K", "AO", "Z"]], [["AH", "M"]]]
    assert exact_match(y_true, ["K AO Z", "AH N"], tokenizer="space") == 0.5
    assert word_error_rate(y_true, ["K AO Z", "AH N"]) == 0.5
    assert word_error_rate(y_true, ["K IH Z", "AH N"]) == 1.0


def test_token_accuracy():
    assert token_accuracy(["1234"], ["1243"]) == 0.5
    assert token_accuracy(["12"], ["1234"]) == 0.5  # extra tokens count against
    assert token_accuracy(["1234"], ["12"]) == 0.5
    # pooled over tokens, not averaged over items: (4 + 0) / (4 + 2)
    assert token_accuracy(["1234", "56"], ["1234", "65"]) == pytest.approx(4 / 6)
    assert token_accuracy([""], [""]) == 1.0


def test_token_accuracy_best_reference():
    y_true = [[["a", "b", "c"], ["a", "x", "c"]]]
    assert token_accuracy(y_true, ["axc"]) == 1.0
    assert token_accuracy(y_true, ["ayc"]) == pytest.approx(2 / 3)


def test_token_error_rate_corpus_level():
    # (3 + 0) / (6 + 3): pooled, not a mean of per-item rates
    assert token_error_rate(["kitten", "abc"], ["sitting", "abc"]) == pytest.approx(3 / 9)
    assert character_error_rate(["kitten"], ["sitting"]) == 0.5
    assert phoneme_error_rate(["K AH Z", "AH M"], ["K AO Z", "AH M"]) == pytest.approx(1 / 5)
    assert token_error_rate(["ab"], ["abxyz"]) == 1.5  # insertions can exceed 1


def test_token_error_rate_closest_reference_counts():
    refs = [[["K", "AH", "Z"], ["K", "AO", "Z", "IH", "Z"]]]
    # closest reference is the first (distance 1 vs 3): 1 / 3
    assert token_error_rate(refs, [["K", "AO", "Z"]], tokenizer="space") == pytest.approx(1 / 3)
    # ties in distance: the longer reference counts (distance 1 each; 1 / 2 not 1 / 1)
    tied = [[["a"], ["a", "b"]]]
    assert token_error_rate(tied, [["b"]]) == pytest.approx(1 / 2)


def test_token_error_rate_needs_reference_tokens():
    with pytest.raises(ValueError, match="y_true"):
        token_error_rate([""], ["abc"])


def test_metrics_accept_numpy_object_arrays():
    y = np.array(["abc", "de"], dtype=object)
    assert exact_match(y, np.array(["abc", "dx"], dtype=object)) == 0.5


def test_metrics_accept_numpy_token_arrays():
    # rows of a 2-D string array, shape (n_items, n_tokens), are token lists, as in Seq2Seq.fit
    y_true = np.array([["K", "AH", "Z"], ["AH", "M", "Z"]])
    y_pred = np.array([["K", "AO", "Z"], ["AH", "M", "Z"]])
    assert exact_match(y_true, y_pred) == 0.5
    assert token_accuracy(y_true, y_pred) == pytest.approx(5 / 6)
    assert token_error_rate(y_true, y_pred) == pytest.approx(1 / 6)
    assert word_error_rate(y_true, y_pred) == 0.5
    # 1-D arrays of str (or object) as items, mixed with str predictions
    refs = [np.array(["K", "AH", "Z"], dtype=object), np.array(["AH", "M"])]
    assert phoneme_error_rate(refs, ["K AO Z", "AH M"]) == pytest.approx(1 / 5)
    tokens = [["the", "cat", "sat", "on", "the", "mat"], ["a", "dog", "barked", "at", "it"]]
    as_lists = corpus_bleu(tokens, [["the", "cat", "sat", "on", "a", "mat"], tokens[1]])
    as_arrays = corpus_bleu(
        [np.array(t) for t in tokens],
        [np.array(["the", "cat", "sat", "on", "a", "mat"]), tokens[1]],
    )
    assert as_arrays == pytest.approx(as_lists)
    # still rejected: a 2-D array as one prediction, non-str tokens
    with pytest.raises(ValueError, match="y_pred"):
        exact_match([["a", "b"]], [np.array([["a", "b"]])])
    with pytest.raises(ValueError, match="y_true"):
        exact_match([np.array([1, 2])], [["a", "b"]])
    with pytest.raises(ValueError, match="y_pred"):
        exact_match([["a"]], [np.array(["a", 2], dtype=object)])


@pytest.mark.parametrize(
    "references",
    [
        [np.array(["K", "AH", "Z", "IH", "Z"]), np.array(["K", "AO", "Z", "IH", "Z"])],
        np.array([["K", "AH", "Z", "IH", "Z"], ["K", "AO", "Z", "IH", "Z"]]),  # (2, n_tokens)
        (np.array(["K", "AH", "Z", "IH", "Z"]), ["K", "AO", "Z", "IH", "Z"]),
    ],
)
def test_several_references_as_numpy_arrays(references):
    # each prediction matches the second reference (first and only item)
    assert exact_match([references], ["K AO Z IH Z"], tokenizer="space") == 1.0
    insertion = [["K", "AO", "Z", "IH", "Z", "IH"]]
    assert token_error_rate([references], insertion) == pytest.approx(1 / 5)
    assert corpus_bleu([references], [["K", "AO", "Z", "IH", "Z"]]) == pytest.approx(100.0)


@pytest.mark.parametrize(
    "metric", [exact_match, token_accuracy, token_error_rate, word_error_rate, corpus_bleu]
)
def test_validation(metric):
    with pytest.raises(ValueError, match="y_pred"):
        metric(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="y_true"):
        metric([], [])
    with pytest.raises(ValueError, match="y_true"):
        metric("ab", "ab")
    with pytest.raises(ValueError, match="y_pred"):
        metric(["a"], [3])


def test_bad_tokenizer_names_the_parameter():
    with pytest.raises(ValueError, match="tokenizer"):
        exact_match(["a"], ["a"], tokenizer="bpe")
    with pytest.raises(ValueError, match="tokenizer"):
        exact_match(["a"], ["a"], tokenizer=["char"])  # unhashable: was a TypeError
    with pytest.raises(ValueError, match="kind"):
        tokenize("a b", ["space"])


@pytest.mark.parametrize(
    "y_true",
    [{"ab", "cd"}, {"ab": 1, "cd": 2}, None, (w for w in ["ab", "cd"]), np.array("ab")],
    ids=["set", "dict", "None", "generator", "0-d array"],
)
def test_unordered_or_unsized_references_are_refused(y_true):
    """A set scored in its own order (exact match 0.0 for equal items), a dict by its keys."""
    with pytest.raises(ValueError, match="y_true must be a sequence"):
        exact_match(y_true, ["ab", "cd"])
    with pytest.raises(ValueError, match="y_pred must be a sequence"):
        exact_match(["ab", "cd"], y_true)


def test_bleu_identical_corpus_is_100():
    refs = ["the cat sat on the mat", "a dog barked at the moon tonight"]
    assert corpus_bleu(refs, refs) == pytest.approx(100.0)
    tokens = [r.split() for r in refs]
    assert corpus_bleu(tokens, tokens) == pytest.approx(100.0)


def test_bleu_matches_sacrebleu_and_uses_several_references():
    import sacrebleu

    hyps = ["the cat is on the mat", "there is a cat here"]
    refs = ["the cat sat on the mat", "a cat is here"]
    expected = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert corpus_bleu(refs, hyps) == pytest.approx(expected)
    assert 0 < expected < 100
    # a second reference equal to the hypothesis lifts the first item's n-gram matches
    multi = [[refs[0].split(), hyps[0].split()], [refs[1].split()]]
    assert corpus_bleu(multi, hyps) > corpus_bleu([r.split() for r in refs], hyps)


def test_bleu_disjoint_is_zero():
    assert corpus_bleu(["a b c d"], ["w x y z"]) == 0.0


@pytest.mark.parametrize("tokenize", ["nope", "13A", 13, ["13a"]])
def test_bleu_bad_tokenize_names_the_parameter(tokenize):
    # sacrebleu alone raises a bare KeyError('nope'); the names it knows still pass
    assert corpus_bleu(["a b c d"], ["a b c d"], tokenize="char") == pytest.approx(100.0)
    with pytest.raises(ValueError, match=r"tokenize must be None or one of \[.*'13a'.*'none'"):
        corpus_bleu(["a b c"], ["a b c"], tokenize=tokenize)


def test_metrics_import_is_cheap():
    code = "import sys, skattn.metrics; print('torch' in sys.modules, 'sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_public_names_exist():
    for name in metrics.__all__:
        assert hasattr(metrics, name)
    # the scorers moved to skattn.scoring and keep their names here
    from skattn import scoring

    for name in scoring.__all__:
        assert getattr(metrics, name) is getattr(scoring, name)
        assert name in dir(metrics)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        metrics.nope  # noqa: B018


def test_docstring_examples():
    import doctest

    import skattn.metrics

    result = doctest.testmod(skattn.metrics)
    assert result.attempted > 0 and result.failed == 0


def test_edit_distance_names_what_it_cannot_compare():
    cases = (("abc", None, "b"), (["AH", None], ["AH"], "a"), (5, "x", "a"), (b"", "abc", "a"))
    for a, b, name in (*cases, (range(0), "x", "a")):  # (empty bytes and ranges passed)
        with pytest.raises(ValueError, match=rf"{name} must be a str or a list of str"):
            metrics.edit_distance(a, b)


def test_bleu_counts_the_ngrams_of_the_tokenizers_tokens():
    """Strings went to sacrebleu as text: a character-level output ("1234") was one word with
    no 2-gram, so a perfect character model scored BLEU 0 through bleu_scorer."""
    digits = ["1234", "5678", "9012"]
    assert corpus_bleu(digits, digits) == 0.0  # as text: one-word sentences (sacrebleu's view)
    assert corpus_bleu(digits, digits, tokenizer="char") == pytest.approx(100.0)
    hyp, ref = ["0124"], ["0123"]
    expected = sacrebleu_score(["0 1 2 4"], ["0 1 2 3"])
    assert corpus_bleu(ref, hyp, tokenizer="char") == pytest.approx(expected)
    assert corpus_bleu([list("0123")], [list("0124")]) == pytest.approx(expected)  # as tokens
    words = ["the cat sat on the mat"]
    assert corpus_bleu(words, ["the cat sat on mat"], tokenizer="space") == pytest.approx(
        corpus_bleu(words, ["the cat sat on mat"])
    )
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        corpus_bleu(digits, digits, tokenizer="word")


def sacrebleu_score(hypotheses, references):
    import sacrebleu

    return sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none").score


def test_edit_distance_takes_rows_of_string_arrays():
    rows = np.array([["K", "AH", "Z"], ["K", "AO", "Z"]])
    assert edit_distance(rows[0], rows[1]) == 1
    assert edit_distance(rows[0], ["K"]) == 2

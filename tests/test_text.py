import sys
import warnings

import numpy as np
import pytest

from skattn.core import text
from skattn.core.items import as_token_lists
from skattn.core.text import BOS, EOS, PAD, UNK, Vocabulary, detokenize, pad_batch, tokenize


def test_special_ids_are_fixed():
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert Vocabulary().to_list() == ["<pad>", "<s>", "</s>", "<unk>"]


@pytest.mark.parametrize(
    ("string", "kind", "tokens"),
    [
        ("abc", "char", ["a", "b", "c"]),
        ("a b", "char", ["a", " ", "b"]),
        ("", "char", []),
        ("K AH  Z", "space", ["K", "AH", "Z"]),
        ("  ", "space", []),
    ],
)
def test_tokenize(string, kind, tokens):
    assert tokenize(string, kind) == tokens


@pytest.mark.parametrize(("string", "kind"), [("a b", "char"), ("K AH Z", "space"), ("", "char")])
def test_detokenize_inverts_tokenize(string, kind):
    assert detokenize(tokenize(string, kind), kind) == string


def test_bad_kind_names_the_parameter():
    with pytest.raises(ValueError, match="kind"):
        tokenize("abc", "word")
    with pytest.raises(ValueError, match="kind"):
        detokenize(["a"], "bpe")


def test_non_string_input_is_rejected():
    with pytest.raises(ValueError, match="text"):
        tokenize(["a", "b"], "char")
    with pytest.raises(ValueError, match="tokens"):
        detokenize("ab", "char")
    for tokens in ([1, 2], None, ["a", None]):  # TypeErrors from str.join
        with pytest.raises(ValueError, match="tokens must be a sequence of str"):
            detokenize(tokens, "space")


def test_vocabulary_first_seen_order_and_dedup():
    v = Vocabulary(["b", "a", "b", "<unk>", "c"])
    assert v.to_list() == ["<pad>", "<s>", "</s>", "<unk>", "b", "a", "c"]
    assert v.tokens == ["b", "a", "c"]
    assert len(v) == 7
    assert "a" in v and "z" not in v


def test_vocabulary_rejects_non_string_tokens():
    with pytest.raises(ValueError, match="tokens"):
        Vocabulary(["a", 1])


def test_encode_maps_unknown_to_unk():
    v = Vocabulary("abc")
    assert v.encode(["c", "a", "z"]) == [6, 4, UNK]
    assert v.token_to_id("zz") == UNK
    assert v.id_to_token(5) == "b"


def test_decode_stops_at_eos_and_drops_specials():
    v = Vocabulary("abc")
    assert v.decode([BOS, 4, PAD, 5, UNK, 6, EOS, 4, 5]) == ["a", "b", "c"]
    assert v.decode(np.array([6, 5], dtype=np.int64)) == ["c", "b"]
    assert v.decode([]) == []


def test_decode_rejects_out_of_range_ids():
    v = Vocabulary("ab")
    with pytest.raises(ValueError, match="ids"):
        v.decode([4, 6])
    with pytest.raises(ValueError, match="ids"):
        v.decode([-1])
    with pytest.raises(ValueError, match="got 9"):
        v.decode([4, 9, 5])
    assert v.decode([4, EOS, 99]) == ["a"]  # nothing past the first EOS is read
    for bad in ("4", 4.7, True, np.bool_(True)):  # int() would take each: "a", "a", "<s>"
        with pytest.raises(ValueError, match="ids must be ints"):
            v.decode([bad])
        with pytest.raises(ValueError, match="ids must be ints"):
            v.id_to_token(bad)
    assert v.decode([np.int32(4), np.uint8(5)]) == ["a", "b"]


def test_encode_decode_round_trip():
    v = Vocabulary.build([tokenize("hello world", "char")])
    tokens = tokenize("world hello", "char")
    assert v.decode(v.encode(tokens) + [EOS]) == tokens


def test_build_min_count():
    v = Vocabulary.build([["x", "y", "x"], ["z", "y", "x"]], min_count=2)
    assert v.tokens == ["x", "y"]
    assert v.encode(["z"]) == [UNK]


@pytest.mark.parametrize("min_count", [0, -1, 1.5, True])
def test_build_bad_min_count(min_count):
    with pytest.raises(ValueError, match="min_count"):
        Vocabulary.build([["a"]], min_count=min_count)


def test_build_min_count_takes_numpy_ints():
    assert Vocabulary.build([["x", "x", "y"]], min_count=np.int64(2)).tokens == ["x"]


def test_to_list_from_list_round_trip():
    v = Vocabulary.build([["K", "AH", "Z"], ["AH", "M"]])
    w = Vocabulary.from_list(v.to_list())
    assert w == v
    assert w.encode(["M", "K"]) == v.encode(["M", "K"])


def test_from_list_validates():
    with pytest.raises(ValueError, match="special"):
        Vocabulary.from_list(["a", "b"])
    with pytest.raises(ValueError, match="duplicates"):
        Vocabulary.from_list([*text.SPECIAL_TOKENS, "a", "a"])


def test_pad_batch():
    ids, lengths = pad_batch([[5, 6, 2], [7, 2], [2]])
    assert ids.dtype == np.int64 and lengths.dtype == np.int64
    np.testing.assert_array_equal(ids, [[5, 6, 2], [7, 2, 0], [2, 0, 0]])
    np.testing.assert_array_equal(lengths, [3, 2, 1])
    ids, lengths = pad_batch(ids for ids in [[5, 6], [7]])  # an iterator, not used up silently
    np.testing.assert_array_equal(ids, [[5, 6], [7, 0]])


def test_pad_batch_custom_pad_and_empty():
    ids, lengths = pad_batch([[4], []], pad_id=9)
    np.testing.assert_array_equal(ids, [[4], [9]])
    np.testing.assert_array_equal(lengths, [1, 0])
    ids, lengths = pad_batch([])
    assert ids.shape == (0, 0) and lengths.shape == (0,)


def test_text_does_not_import_torch_or_sklearn():
    import subprocess

    code = "import sys, skattn.core.text; print('torch' in sys.modules, 'sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_docstring_examples():
    import doctest

    import skattn.core.text

    result = doctest.testmod(skattn.core.text)
    assert result.attempted > 0 and result.failed == 0


def test_a_one_column_string_array_warns_that_rows_are_one_token_lists():
    """``df[["word"]].to_numpy()`` is (n, 1): each row is a token list of one token, so a model
    fitted on it learns whole words as tokens, in silence (exact match 0.02 against 1.0)."""
    column = np.array(["ab", "cd"])[:, None]
    with pytest.warns(UserWarning, match=r"X is a 2-D array of one column.*X\.ravel\(\)"):
        assert as_token_lists(column, "X", "char") == ([["ab"], ["cd"]], "tokens")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        as_token_lists(column.ravel(), "X", "char")  # strings: no warning
        as_token_lists(np.array([["a", "b"], ["c", "d"]]), "X", "char")  # two tokens a row


def test_skattn_text_is_the_core_modules_public_names():
    # DESIGN.md's layout: skattn.text, tokenization and vocabularies (torch-free)
    import skattn.core.text
    import skattn.text

    assert skattn.text.__all__ == skattn.core.text.__all__
    for name in skattn.text.__all__:
        assert getattr(skattn.text, name) is getattr(skattn.core.text, name)
    assert skattn.text.tokenize("ab c", "char") == ["a", "b", " ", "c"]

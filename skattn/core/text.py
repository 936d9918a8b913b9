"""Tokenization and vocabularies: strings <-> token lists <-> integer ids.

What users hand the estimator (``X``, ``y``, references) is checked and read into token lists
by :mod:`skattn.core.items`, which tokenizes through this module.

The first step of the data flow (strings -> padded id arrays) and the last (ids -> strings).
This module is torch-free and scikit-learn-free: the ``serving`` runtime imports it.

Special ids are fixed and identical in every vocabulary::

    PAD = 0  "<pad>"    padding in a batch
    BOS = 1  "<s>"      decoder input at the first step
    EOS = 2  "</s>"     end of a sequence (also the end-of-source marker)
    UNK = 3  "<unk>"    any token not in the vocabulary
"""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from skattn.core.checks import check_int

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "SPECIAL_TOKENS",
    "TOKENIZERS",
    "UNK",
    "Vocabulary",
    "check_tokenizer",
    "detokenize",
    "pad_batch",
    "tokenize",
]

PAD = 0
BOS = 1
EOS = 2
UNK = 3
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")


def _split_chars(text: str) -> list[str]:
    return list(text)


def _split_space(text: str) -> list[str]:
    return text.split()


# name -> (tokenize, detokenize)
TOKENIZERS: dict[str, tuple[Callable[[str], list[str]], Callable[[Sequence[str]], str]]] = {
    "char": (_split_chars, "".join),
    "space": (_split_space, " ".join),
}


def check_tokenizer(value: object, name: str = "tokenizer") -> None:
    """``ValueError`` naming ``name`` unless ``value`` is one of :data:`TOKENIZERS`' names."""
    if not isinstance(value, str) or value not in TOKENIZERS:
        raise ValueError(f"{name} must be one of {sorted(TOKENIZERS)}, got {value!r}")


def tokenize(text: str, kind: str) -> list[str]:
    """Split a string into tokens.

    Parameters
    ----------
    text : str
        The string to split.
    kind : {"char", "space"}
        ``"char"``: one token per character (``list(text)``); ``"space"``: tokens separated by
        whitespace (``text.split()``).

    Returns
    -------
    list of str

    Examples
    --------
    >>> tokenize("abc", "char")
    ['a', 'b', 'c']
    >>> tokenize("K AH  Z", "space")
    ['K', 'AH', 'Z']
    """
    check_tokenizer(kind, "kind")
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    return TOKENIZERS[kind][0](text)


def detokenize(tokens: Sequence[str], kind: str) -> str:
    """Join tokens back into a string: the inverse of :func:`tokenize`.

    Parameters
    ----------
    tokens : sequence of str
    kind : {"char", "space"}
        ``"char"`` joins with ``""``, ``"space"`` with ``" "``.

    Returns
    -------
    str

    Examples
    --------
    >>> detokenize(["K", "AH", "Z"], "space")
    'K AH Z'
    """
    check_tokenizer(kind, "kind")
    if isinstance(tokens, str):
        raise ValueError("tokens must be a sequence of str, not a str")
    try:  # (no check a token at a time: every prediction comes through here)
        return TOKENIZERS[kind][1](tokens)
    except TypeError:  # not iterable, or not all str
        raise ValueError(f"tokens must be a sequence of str, got {tokens!r:.80}") from None


class Vocabulary:
    """A bijection between tokens and integer ids, with the four fixed specials first.

    Ids 0..3 are ``SPECIAL_TOKENS`` (``PAD``, ``BOS``, ``EOS``, ``UNK``); the given tokens
    follow in first-seen order, duplicates (and any special token among them) skipped.

    Parameters
    ----------
    tokens : iterable of str
        The ordinary tokens.

    Examples
    --------
    >>> v = Vocabulary("abca")
    >>> len(v), v.encode(["c", "z"]), v.decode([6, 4, EOS, 5])
    (7, [6, 3], ['c', 'a'])
    """

    def __init__(self, tokens: Iterable[str] = ()) -> None:
        self._id_to_token: list[str] = list(SPECIAL_TOKENS)
        self._token_to_id: dict[str, int] = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
        for token in tokens:
            if not isinstance(token, str):
                raise ValueError(f"tokens must be str, got {type(token).__name__}: {token!r}")
            if token not in self._token_to_id:
                self._token_to_id[token] = len(self._id_to_token)
                self._id_to_token.append(token)

    @classmethod
    def build(cls, sequences: Iterable[Sequence[str]], min_count: int = 1) -> Vocabulary:
        """Build a vocabulary from token sequences, keeping tokens seen ``min_count`` times.

        Parameters
        ----------
        sequences : iterable of sequences of str
            Token lists (a str counts as its characters).
        min_count : int, default=1
            Tokens seen fewer times map to ``UNK``.

        Returns
        -------
        Vocabulary
            Tokens in first-seen order.
        """
        min_count = check_int(min_count, "min_count")
        counts: Counter[str] = Counter()
        for sequence in sequences:
            counts.update(sequence)  # Counter keeps first-seen order
        return cls(token for token, count in counts.items() if count >= min_count)

    def __len__(self) -> int:
        return len(self._id_to_token)

    def __contains__(self, token: object) -> bool:
        return token in self._token_to_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self._id_to_token == other._id_to_token

    __hash__ = None  # mutable-looking value type: equal by content, not hashable

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)})"

    @property
    def tokens(self) -> list[str]:
        """The ordinary tokens in id order (specials excluded)."""
        return self._id_to_token[len(SPECIAL_TOKENS) :]

    def token_to_id(self, token: str) -> int:
        """The id of ``token``, ``UNK`` when it is unknown."""
        return self._token_to_id.get(token, UNK)

    def id_to_token(self, index: int) -> str:
        """The token with id ``index``."""
        self._check_id(index)
        return self._id_to_token[index]

    def _check_id(self, index: int) -> None:
        # an int (NumPy's too), never a bool, a float or a str that int() would accept; a plain
        # int (what the searches give) skips the slower abstract-class check
        if type(index) is not int and (
            isinstance(index, bool | np.bool_) or not isinstance(index, numbers.Integral)
        ):
            raise ValueError(f"ids must be ints, got {index!r}")
        if not 0 <= index < len(self._id_to_token):
            raise ValueError(f"ids must lie in [0, {len(self)}), got {index!r}")

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Map tokens to ids; unknown tokens map to ``UNK``.

        Data never holds special ids: a token spelled like a special one (``"</s>"`` in a text)
        is unknown too, rather than ending or padding the sequence.

        Parameters
        ----------
        tokens : iterable of str

        Returns
        -------
        list of int
            No ``BOS`` or ``EOS`` is added.
        """
        lookup, n_specials = self._token_to_id, len(SPECIAL_TOKENS)
        return [UNK if (i := lookup.get(token, UNK)) < n_specials else i for token in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Map ids back to tokens, stopping at the first ``EOS`` and dropping special ids.

        Parameters
        ----------
        ids : iterable of int
            Python or NumPy integers.

        Returns
        -------
        list of str
        """
        n_specials = len(SPECIAL_TOKENS)
        tokens = []
        for raw in ids:
            self._check_id(raw)
            index = int(raw)
            if index == EOS:
                break
            if index >= n_specials:
                tokens.append(self._id_to_token[index])
        return tokens

    def to_list(self) -> list[str]:
        """All tokens in id order, specials included (what the artifact manifest stores)."""
        return list(self._id_to_token)

    @classmethod
    def from_list(cls, tokens: Sequence[str]) -> Vocabulary:
        """Rebuild a vocabulary from :meth:`to_list` output.

        Parameters
        ----------
        tokens : sequence of str
            Must start with ``SPECIAL_TOKENS`` and hold no duplicates.

        Returns
        -------
        Vocabulary
        """
        tokens = list(tokens)
        n_specials = len(SPECIAL_TOKENS)
        if tuple(tokens[:n_specials]) != SPECIAL_TOKENS:
            raise ValueError(
                f"tokens must start with the special tokens {list(SPECIAL_TOKENS)}, "
                f"got {tokens[:n_specials]}"
            )
        if len(set(tokens)) != len(tokens):
            raise ValueError("tokens must not hold duplicates")
        return cls(tokens[n_specials:])


def pad_batch(
    id_lists: Sequence[Sequence[int]], pad_id: int = PAD
) -> tuple[np.ndarray, np.ndarray]:
    """Stack id lists of different lengths into one right-padded array.

    Parameters
    ----------
    id_lists : sequence of sequences of int
        One id list per item (``B`` items).
    pad_id : int, default=PAD
        The id written after each item's end.

    Returns
    -------
    ids : ndarray of int64, shape (B, T_max)
        ``T_max`` is the longest item's length (0 for an empty batch).
    lengths : ndarray of int64, shape (B,)

    Examples
    --------
    >>> ids, lengths = pad_batch([[5, 6, 2], [7, 2]])
    >>> ids.tolist(), lengths.tolist()
    ([[5, 6, 2], [7, 2, 0]], [3, 2])
    """
    id_lists = list(id_lists)  # an iterator would be used up by the lengths
    lengths = np.array([len(ids) for ids in id_lists], dtype=np.int64)  # (B,)
    max_length = int(lengths.max()) if len(lengths) else 0
    batch = np.full((len(lengths), max_length), pad_id, dtype=np.int64)  # (B, T_max)
    for row, ids in enumerate(id_lists):
        batch[row, : len(ids)] = ids
    return batch, lengths

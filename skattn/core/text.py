"""Tokenization and vocabularies: strings <-> token lists <-> integer ids.

The first step of the data flow (strings -> padded id arrays) and the last (ids -> strings).
This module is torch-free and scikit-learn-free: the ``serving`` runtime imports it.

Special ids are fixed and identical in every vocabulary::

    PAD = 0  "<pad>"    padding in a batch
    BOS = 1  "<s>"      decoder input at the first step
    EOS = 2  "</s>"     end of a sequence (also the end-of-source marker)
    UNK = 3  "<unk>"    any token not in the vocabulary
"""

from __future__ import annotations

import itertools
import numbers
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

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
    "as_outputs",
    "as_scored_pairs",
    "as_token_lists",
    "as_token_pairs",
    "check_output_lengths",
    "check_references",
    "check_tokenizer",
    "check_utf8",
    "detokenize",
    "encodes_to_utf8",
    "pad_batch",
    "refuse_reserved_tokens",
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


def ordered_items(items: Any, name: str, what: str = "str") -> list:
    """``items`` as a list if it is a sized collection in the caller's order (a list, tuple,
    1-D array, pandas Series), else ``ValueError`` naming ``name``: a single str or bytes, a
    set or mapping (whose order is not the caller's, so answers could not be matched to
    items), a 0-d array, an iterator."""
    unordered = isinstance(items, set | frozenset | Mapping)
    zero_d = isinstance(items, np.ndarray) and items.ndim == 0
    # a table (a pandas DataFrame: ndim 2) iterates over its column names, not its rows
    table = not isinstance(items, np.ndarray) and getattr(items, "ndim", 1) != 1
    sized = hasattr(items, "__len__")
    if isinstance(items, str | bytes) or not sized or unordered or zero_d or table:
        raise ValueError(
            f"{name} must be a sequence of {what} (in order: a list, tuple or 1-D array), got "
            f"{type(items).__name__} {items!r}"[:300]
        )
    listed = list(items)
    if len(listed) != len(items):  # len counts one thing, iteration yields another
        raise ValueError(
            f"{name} must be a sequence of {what}: len({name}) is {len(items)} but it yields "
            f"{len(listed)} items ({type(items).__name__})"
        )
    return listed


def as_token_lists(items: Any, name: str, tokenizer: str) -> tuple[list[list[str]], str]:
    """Tokenize a sequence of str / token-list items; also say which kind the items were.

    What the estimator accepts as ``X`` and ``y``: strings (split by ``tokenizer``) or token
    lists (lists, tuples or 1-D NumPy arrays of str), not a mix; ``name`` names the argument in
    errors. Returns the token lists and ``"str"`` or ``"tokens"``.
    """
    check_tokenizer(tokenizer)
    if isinstance(items, np.ndarray) and items.ndim == 2 and items.shape[1] == 1 and items.size:
        if all(isinstance(item, str) for item in items[:, 0]):  # df[["word"]].to_numpy(), say
            warnings.warn(
                f"{name} is a 2-D array of one column: each row is read as a list of one token "
                f"(its whole string); pass {name}.ravel() to read each row as a string",
                UserWarning,
                stacklevel=3,
            )
    items = ordered_items(items, name, "str or of token lists")
    if not items:
        raise ValueError(f"{name} must hold at least one item, got an empty sequence")
    token_lists, kinds = [], set()
    for index, item in enumerate(items):
        if isinstance(item, str):
            check_utf8(item, name, index)
            token_lists.append(tokenize(item, tokenizer))
            kinds.add("str")
        elif isinstance(item, list | tuple) or (isinstance(item, np.ndarray) and item.ndim == 1):
            if not all(isinstance(t, str) for t in item):
                raise ValueError(
                    f"{name}[{index}] must be a str or a list of str tokens, got {item!r}"
                )
            for token in item:
                check_utf8(token, name, index)
            token_lists.append([str(t) for t in item])
            kinds.add("tokens")
        else:
            raise ValueError(f"{name}[{index}] must be a str or a list of str tokens, got {item!r}")
    if len(kinds) > 1:
        raise ValueError(f"{name} must hold only str items or only token lists, not both")
    return token_lists, kinds.pop()


def as_outputs(items: Any, name: str, tokenizer: str, output_kind: str) -> list[list[str]]:
    """Outputs to score, as token lists (:func:`as_token_lists`), given as the model gives them:
    a model fitted on token lists refuses strings, which its tokenizer would split into other
    tokens (``"K AE T"`` read by the char tokenizer is ``K``, `` ``, ``A``, ...: a pronunciation
    the model can never produce, so it would score ``-inf`` without a word)."""
    token_lists, kind = as_token_lists(items, name, tokenizer)
    if kind == "str" and output_kind == "tokens":
        raise _strings_for_token_lists(name)
    return token_lists


def check_references(items: Any, name: str, output_kind: str) -> None:
    """References to score a model's outputs against, as a metric reads them (each item one
    reference, or a list of token lists: several): a model fitted on token lists refuses an
    item that is a string (see :func:`as_outputs`); the metric checks the rest."""
    if output_kind == "tokens" and any(
        isinstance(item, str) for item in ordered_items(items, name, "reference")
    ):
        raise _strings_for_token_lists(name)


def _strings_for_token_lists(name: str) -> ValueError:
    return ValueError(
        f"{name} holds strings, but the model was fitted on token lists (its predictions are "
        f"token lists): give each output as a list of tokens"
    )


def encodes_to_utf8(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form: no lone surrogate (JSON's ``\\ud800`` escapes and
    ``errors="surrogateescape"`` decoding can make one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_utf8(text: str, name: str, index: int | None = None) -> None:
    """``ValueError`` naming ``name`` (``name[index]`` with an index) if ``text`` holds a lone
    surrogate (``"\\ud800"``, as ``errors="surrogateescape"`` decoding leaves): it has no UTF-8
    form, so no request could send it and no manifest could store it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        where = name if index is None else f"{name}[{index}]"
        raise ValueError(
            f"{where} holds {text[error.start : error.end]!r}, which is not valid "
            f"Unicode text (a lone surrogate): it has no UTF-8 form"
        ) from None


def as_token_pairs(X: Any, y: Any, tokenizer: str) -> tuple[list, list, str]:
    """Sources and targets as token lists (:func:`as_token_lists`), checked to pair up; also
    the kind the targets were (``"str"`` or ``"tokens"``)."""
    if y is None:
        raise ValueError("Seq2Seq requires y to be passed, but the target y is None")
    sources, _ = as_token_lists(X, "X", tokenizer)
    targets, kind = as_token_lists(y, "y", tokenizer)
    if len(sources) != len(targets):
        raise ValueError(
            f"X and y must have the same length, got {len(sources)} and {len(targets)}"
        )
    return sources, targets, kind


def check_output_lengths(token_lists: Sequence[Sequence[str]], limit: int, name: str) -> None:
    """``ValueError`` naming the first output longer than ``limit`` tokens (the most any model
    writes, ``MAX_OUTPUT_LENGTH``): scoring one steps the decoder once a token, so an output
    of 10^5 tokens would hold a process (a server) for minutes, as the source guard says of
    sources."""
    for index, tokens in enumerate(token_lists):
        if len(tokens) > limit:
            raise ValueError(
                f"{name}[{index}] holds {len(tokens)} tokens, more than any model writes "
                f"({limit}, the most an artifact's max_output_length may be)"
            )


def as_scored_pairs(X: Any, y: Any, tokenizer: str, output_kind: str) -> list[list[str]]:
    """The targets of ``score(X, y)`` as token lists (:func:`as_outputs`: a model fitted on token
    lists refuses string targets), checked to pair up with ``X``."""
    if y is None:
        raise ValueError("score requires y to be passed, but the target y is None")
    sources, _ = as_token_lists(X, "X", tokenizer)
    targets = as_outputs(y, "y", tokenizer, output_kind)
    if len(sources) != len(targets):
        raise ValueError(
            f"X and y must have the same length, got {len(sources)} and {len(targets)}"
        )
    return targets


def refuse_reserved_tokens(targets: list[list[str]], output_kind: str = "str") -> None:
    """A target token spelled like a special one could never be output (a source one is unknown).

    Token-list targets (``output_kind="tokens"``) also refuse an empty token and one holding
    whitespace: the server answers a token-list prediction as its tokens joined by spaces,
    which would read ``["x y", "z"]`` as three tokens and drop an empty one."""
    reserved = set(SPECIAL_TOKENS).intersection(itertools.chain.from_iterable(targets))
    if reserved:
        raise ValueError(
            f"y holds the token {min(reserved)!r}, which skattn reserves for a special id "
            f"({', '.join(SPECIAL_TOKENS)}): the model could never output it; rename it"
        )
    if output_kind != "tokens":
        return
    for index, tokens in enumerate(targets):
        for token in tokens:
            if token.split() != [token]:
                raise ValueError(
                    f"y[{index}] holds the token {token!r}: an output token must be non-empty "
                    f"and hold no whitespace (served predictions join tokens with spaces)"
                )

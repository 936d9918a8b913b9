"""The items users hand the estimators (``X``, ``y``, outputs to score, references), checked
and read into token lists: in the caller's order, strings or token lists but not a mix,
valid UTF-8, no reserved token, one target per source.

Every refusal is a ``ValueError`` naming the argument (``X``, ``y[3]``, ...). Torch-free and
scikit-learn-free, as :mod:`skattn.core.text` is, whose tokenizers it applies: the ``serving``
runtime's checks read text through it too.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from skattn.core.text import SPECIAL_TOKENS, check_tokenizer, tokenize

__all__ = [
    "as_outputs",
    "as_scored_pairs",
    "as_token_lists",
    "as_token_pairs",
    "check_output_lengths",
    "check_references",
    "check_utf8",
    "encodes_to_utf8",
    "ordered_items",
    "refuse_reserved_tokens",
]


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

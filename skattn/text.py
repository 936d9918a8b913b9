"""Tokenization and vocabularies, under the contract's name (``skattn.text``).

The code lives in the torch-free core, :mod:`skattn.core.text`, which ``serving`` imports
too; this module is that one's public names. Models pickled by skattn 0.1 name
``skattn.text.Vocabulary``, so they load through it as well.
"""

from skattn.core.text import (
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    TOKENIZERS,
    UNK,
    Vocabulary,
    check_tokenizer,
    detokenize,
    pad_batch,
    tokenize,
)

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

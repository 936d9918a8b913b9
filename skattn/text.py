"""Tokenization and vocabularies, under the contract's name (``skattn.text``).

The code lives in the torch-free core, :mod:`skattn.core.text`, which ``serving`` imports
too; this module gives that one's public names (its ``__all__``). Models pickled by skattn 0.1
name ``skattn.text.Vocabulary``, so they load through it as well.
"""

from skattn.core import text as _core
from skattn.core.text import *  # noqa: F403 (the core's __all__, written once)

__all__ = list(_core.__all__)

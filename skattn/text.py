"""The old name of :mod:`skattn.core.text`, kept so that models pickled by skattn 0.1 load.

Their pickles name ``skattn.text.Vocabulary``; new code imports ``skattn.core.text``.
"""

from skattn.core.text import Vocabulary

__all__ = ["Vocabulary"]

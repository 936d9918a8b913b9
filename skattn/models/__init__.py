"""Torch models: a bidirectional RNN encoder and Bahdanau / Luong attention decoders.

``Seq2SeqModule`` is the seam that training (``skattn.estimator``), decoding
(``skattn.core.search``) and export (``skattn.export``) share: ``encode``, ``step``,
``forward`` and ``state_names``.
"""

from skattn.models.decoders import BahdanauDecoder, FinalStateContext, LuongDecoder
from skattn.models.encoder import BiRNNEncoder, EncoderOutput, reverse_within_length
from skattn.models.seq2seq import Seq2SeqModule

__all__ = [
    "BahdanauDecoder",
    "BiRNNEncoder",
    "EncoderOutput",
    "FinalStateContext",
    "LuongDecoder",
    "Seq2SeqModule",
    "reverse_within_length",
]

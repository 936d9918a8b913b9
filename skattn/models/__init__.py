"""Torch models: a bidirectional RNN encoder and Bahdanau / Luong attention decoders.

``ModelConfig`` holds a model's hyperparameters; ``Seq2SeqModule(config)`` is the seam that
training (``skattn.training``), decoding (``skattn.core.search``) and export (``skattn.export``)
share: ``encode``, ``step``, ``forward`` and ``state_names``.
"""

from skattn.models.config import OPTIONS, ModelConfig
from skattn.models.decoders import BahdanauDecoder, FinalStateContext, LuongDecoder
from skattn.models.encoder import BiRNNEncoder, EncoderOutput, reverse_within_length
from skattn.models.seq2seq import Seq2SeqModule

__all__ = [
    "OPTIONS",
    "BahdanauDecoder",
    "BiRNNEncoder",
    "EncoderOutput",
    "FinalStateContext",
    "LuongDecoder",
    "ModelConfig",
    "Seq2SeqModule",
    "reverse_within_length",
]

"""Pickling of estimators that hold a ``Seq2SeqModule`` as ``module_``.

A pickle stores the module as its config and a CPU state dict
(``Seq2SeqModule.portable_state``), so a model trained on a GPU loads on a machine without one,
and a model pickled by an older skattn gets the defaults of the parameters added since.
"""

from __future__ import annotations

import inspect

from skattn.models import Seq2SeqModule

__all__ = ["PortableModule"]


class PortableModule:
    """Mixin (before ``BaseEstimator``): ``module_`` travels as a portable state."""

    def __getstate__(self) -> dict:
        """Store the module as its config and a CPU state dict, so any machine can load it."""
        state = dict(super().__getstate__())  # a copy: object.__getstate__ returns __dict__
        module = state.pop("module_", None)
        if module is not None:
            state["_module"] = module.portable_state()
        return state

    def __setstate__(self, state: dict) -> None:
        """Rebuild the module; a model trained on a GPU loads on CPU when CUDA is missing. A
        model pickled by an older skattn gets the defaults of parameters added since."""
        module = state.pop("_module", None)
        if "_module_config" in state:  # pickled by skattn 0.1 before the redesign
            module = {"config": state.pop("_module_config"), "weights": state.pop("_module_state")}
        defaults = inspect.signature(type(self)).parameters
        state = {name: p.default for name, p in defaults.items()} | state
        super().__setstate__(state)
        if module is not None:
            self.module_ = Seq2SeqModule.from_portable_state(module, self.device_)
            self.device_ = next(self.module_.parameters()).device

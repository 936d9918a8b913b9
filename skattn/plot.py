"""The old name of :mod:`skattn.plotting` (the contract's name), kept so that code written for
skattn 0.1 runs: ``from skattn.plot import plot_attention`` still works."""

from skattn.plotting import plot_attention

__all__ = ["plot_attention"]

"""Placeholder: being written (not yet implemented)."""


def plot_attention(*args, **kwargs):
    raise NotImplementedError("plot_attention is not implemented yet")


def plot_heads(*args, **kwargs):
    raise NotImplementedError("plot_heads is not implemented yet")


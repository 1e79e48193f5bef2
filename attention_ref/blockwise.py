"""Placeholder: being written (not yet implemented)."""


def blockwise_attention(*args, **kwargs):
    raise NotImplementedError("blockwise_attention is not implemented yet")


def merge_attention(*args, **kwargs):
    raise NotImplementedError("merge_attention is not implemented yet")


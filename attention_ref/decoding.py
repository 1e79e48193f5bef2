"""Placeholder: being written (not yet implemented)."""


def KVCache(*args, **kwargs):
    raise NotImplementedError("KVCache is not implemented yet")


def decode_step(*args, **kwargs):
    raise NotImplementedError("decode_step is not implemented yet")


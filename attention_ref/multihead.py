"""Placeholder: being written (not yet implemented)."""


def MultiHeadParams(*args, **kwargs):
    raise NotImplementedError("MultiHeadParams is not implemented yet")


def init_multi_head_params(*args, **kwargs):
    raise NotImplementedError("init_multi_head_params is not implemented yet")


def merge_heads(*args, **kwargs):
    raise NotImplementedError("merge_heads is not implemented yet")


def multi_head_attention(*args, **kwargs):
    raise NotImplementedError("multi_head_attention is not implemented yet")


def split_heads(*args, **kwargs):
    raise NotImplementedError("split_heads is not implemented yet")


"""Placeholder: being written (not yet implemented)."""


def alibi_bias(*args, **kwargs):
    raise NotImplementedError("alibi_bias is not implemented yet")


def alibi_slopes(*args, **kwargs):
    raise NotImplementedError("alibi_slopes is not implemented yet")


def apply_rope(*args, **kwargs):
    raise NotImplementedError("apply_rope is not implemented yet")


def sinusoidal_positions(*args, **kwargs):
    raise NotImplementedError("sinusoidal_positions is not implemented yet")


"""The keyword options the attention functions share, named and given their defaults once.

`scaled_dot_product_attention` says what attention computes: a mask, a bias, causality and where its diagonal
sits, a window, the scale, a soft cap, ALiBi slopes, sinks, dropout, grouped-query heads, fp8 descales and the
normalization of the weights (softmax or sigmoid).
`blockwise_attention`, `attention_backward`, `decode_step` and `multi_head_attention` take all of these options
or some of them, with the same meanings and defaults. `OPTIONS` lists them here, once. Each of those functions
declares ``**options`` and is decorated with `takes_options`, which

- shows the options as keyword-only parameters of the function's signature (what `help`, IPython and the API
  pages read), after its own positional parameters and before its own keyword-only ones;
- calls the function with every option it takes, the defaults filled in, so its body can pass them on whole
  (``prepare_attention(q, k, v, **options)``);
- rejects any other keyword with the TypeError Python gives for an unknown keyword argument.
"""

from __future__ import annotations

import functools
import inspect

__all__: list[str] = []  # private module

#: Every shared option and its default, in the order the signatures list them.
OPTIONS: dict[str, object] = {
    "mask": None,
    "bias": None,
    "is_causal": False,
    "causal_alignment": "top-left",
    "window": None,
    "scale": None,
    "softcap": None,
    "alibi_slopes": None,
    "sinks": None,
    "dropout_p": 0.0,
    "rng": None,
    "dropout_mask": None,
    "enable_gqa": False,
    "q_descale": None,
    "k_descale": None,
    "v_descale": None,
    "normalization": "softmax",
    "sigmoid_bias": None,
}

#: The options of dropout: its probability, and either a generator to draw the mask or the mask itself.
DROPOUT = ("dropout_p", "rng", "dropout_mask")
#: The descale factors of fp8 inputs (a forward-only option set: the backward takes no fp8).
DESCALES = ("q_descale", "k_descale", "v_descale")
#: The choice of the weights' normalization and the options of each (`attention_ref._normalization`): the dense
#: forward and backward, and what calls them whole (decoding, multi-head attention), take them.
NORMALIZATION = ("normalization", "sigmoid_bias")
#: The options of a deterministic softmax call: all but dropout's and the normalization's (`blockwise_attention`'s
#: set: its online softmax has no other normalization).
DETERMINISTIC = tuple(name for name in OPTIONS if name not in DROPOUT + NORMALIZATION)


def takes_options(*names: str):
    """Decorator: give ``fn(..., **options)`` the shared options `names` (all of `OPTIONS` when none are named).

    The options keep `OPTIONS`' order whatever the order of `names`.
    """
    unknown = [name for name in names if name not in OPTIONS]
    if unknown:
        raise ValueError(f"takes_options: {unknown} are not shared options; they are {list(OPTIONS)}")
    defaults = {name: value for name, value in OPTIONS.items() if not names or name in names}

    def decorate(fn):
        *own, rest = inspect.signature(fn).parameters.values()
        if rest.kind is not inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"takes_options: {fn.__qualname__} must end its parameters with **options")
        clash = [p.name for p in own if p.name in defaults]
        if clash:
            raise TypeError(f"takes_options: {fn.__qualname__} declares the shared options {clash} itself")
        keyword_only = inspect.Parameter.KEYWORD_ONLY
        own_keywords = frozenset(p.name for p in own if p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        shared = [inspect.Parameter(name, keyword_only, default=value) for name, value in defaults.items()]

        n_shared = len(defaults)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            options = {**defaults, **kwargs}
            if len(options) == n_shared:  # every keyword given is a shared option
                return fn(*args, **options)
            mine = {key: options.pop(key) for key in kwargs if key not in defaults}
            for key in mine:
                if key not in own_keywords:
                    raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {key!r}")
            return fn(*args, **mine, **options)

        call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [p for p in own if p.kind is not keyword_only] + shared + [p for p in own if p.kind is keyword_only],
            return_annotation=inspect.signature(fn).return_annotation,
        )
        call.options = tuple(defaults)  # type: ignore[attr-defined]
        return call

    return decorate

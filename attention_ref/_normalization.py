"""How scores become weights: the softmax of each row, or a normalization of each score on its own.

The softmax is every path's own computation (the blocked dense kernel, the online softmax of the blockwise
path and of the checkers' tiles, the baseline's rounded softmax): it normalises a row, has a log-sum-exp and
takes sinks. Any other normalization is *elementwise*, one weight from one score, and is an object the
package calls through three hooks, whatever it computes:

- ``from_options(options, n_keys, dtype)`` (a class method): the object for the call's checked options, its
  own among them (named in its ``OPTIONS``);
- ``weights(scores, rnd)``: the weights (..., L, S) of scores with every additive term in them (``-inf`` for a
  masked key, which must give 0); `rnd` rounds each step (the checkers' baseline passes its dtype's);
- ``score_grad(weights, dweights, rnd)``: the gradient of the scores from that of the weights.

`prepare_attention` puts the chosen object on the problem as ``normalization`` (None for the softmax); the
dense forward (`attention_ref.attention`), the backward (`attention_ref.backward`) and the checkers' naive
baseline read the hooks from there. `NORMALIZATIONS` is the one registration point: a new normalization is
its module (as `attention_ref.sigmoid`), its line here, and its options' defaults in
`attention_ref._options.OPTIONS`.
"""

from __future__ import annotations

from typing import Any

from ._validation import check_choice, check_supported
from .sigmoid import Sigmoid

__all__: list[str] = []  # private module

#: Each normalization ``normalization=`` takes, by name, with its class (None: the softmax, the default).
NORMALIZATIONS: dict[str, Any] = {"softmax": None, "sigmoid": Sigmoid}
#: Where a function that computes the softmax only sends a caller asking for another normalization.
ELSEWHERE = ("scaled_dot_product_attention, attention_backward, varlen_attention, paged_attention, "
             "decode_step, multi_head_attention and the checkers take normalization='sigmoid'")


def choose_normalization(options: dict, n_keys: int, dtype):
    """The checked normalization of `options`: None for the softmax, else its object (`from_options`).

    A ValueError names ``normalization`` when it is unknown, and an option of another normalization when
    that option is given (``sigmoid_bias`` with the softmax).
    """
    name = check_choice(options["normalization"], "normalization", tuple(NORMALIZATIONS))
    chosen = NORMALIZATIONS[name]
    for other, kind in NORMALIZATIONS.items():
        for option in () if kind is None or kind is chosen else kind.OPTIONS:
            if options.get(option) is not None:
                raise ValueError(f"{option} is an option of normalization={other!r}; got {option}={options[option]!r} "
                                 f"with normalization={name!r}")
    return None if chosen is None else chosen.from_options(options, n_keys, dtype)


def needs_softmax(normalization, what: str) -> None:
    """A ValueError naming `normalization` if it is not the softmax where `what` (an option, a checker) needs one."""
    check_choice(normalization, "normalization", tuple(NORMALIZATIONS))
    if normalization != "softmax":
        raise ValueError(f"{what} has no meaning with normalization={normalization!r}: it needs the softmax")


def softmax_only(normalization, function: str) -> None:
    """A ValueError naming `normalization` unless it is the softmax: `function` has no other normalization."""
    check_choice(normalization, "normalization", tuple(NORMALIZATIONS))
    check_supported(normalization, "normalization", ("softmax",), function, ELSEWHERE)

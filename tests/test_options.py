"""The shared keyword options (``attention_ref/_options.py``): defined once, shown in every signature, passed on.

Each public function that takes them shows them in its signature with `OPTIONS`' defaults, refuses a keyword it
does not take, and hands every option it takes on to the checks: a bad value of each option is refused naming
that option (an option dropped on the way would not be).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import attention_ref as ar
from attention_ref._options import DESCALES, DETERMINISTIC, OPTIONS, takes_options

rng = np.random.default_rng(0)
Q, K, V = rng.standard_normal((3, 2, 4, 8))  # (H, L, E): two heads, four positions
PARAMS = ar.init_multi_head_params(np.random.default_rng(1), 8, 2)
X = rng.standard_normal((4, 8))  # (L, d_model)

#: Each function, a call of it with any options, and the shared options it takes.
CALLS = {
    "scaled_dot_product_attention": (lambda **o: ar.scaled_dot_product_attention(Q, K, V, **o), tuple(OPTIONS)),
    "blockwise_attention": (lambda **o: ar.blockwise_attention(Q, K, V, block_size=2, **o),
                            (*DETERMINISTIC, "normalization")),
    "attention_backward": (lambda **o: ar.attention_backward(Q, K, V, np.ones_like(Q), **o),
                           tuple(name for name in OPTIONS if name not in DESCALES)),
    "decode_step": (lambda **o: ar.decode_step(Q, K, V, ar.KVCache(), **o),
                    ("window", "scale", "softcap", "alibi_slopes", "sinks", "enable_gqa", "normalization",
                     "sigmoid_bias")),
    "multi_head_attention": (lambda **o: ar.multi_head_attention(X, PARAMS, **o),
                             ("mask", "bias", "is_causal", "causal_alignment", "window", "softcap", "alibi_slopes",
                              "sinks", "normalization", "sigmoid_bias")),
}

#: A value each option refuses (with what else it needs to be read), and the error it gives.
BAD = {
    "mask": ({"mask": np.ones((4, 4))}, TypeError),  # a float mask: pass it as bias
    "bias": ({"bias": "x"}, TypeError),
    "is_causal": ({"is_causal": "yes"}, TypeError),
    "causal_alignment": ({"causal_alignment": "bottom"}, ValueError),
    "window": ({"window": (-1, 0)}, ValueError),
    "scale": ({"scale": "x"}, TypeError),
    "softcap": ({"softcap": -1.0}, ValueError),
    "alibi_slopes": ({"alibi_slopes": "x"}, TypeError),
    "sinks": ({"sinks": "x"}, TypeError),
    "dropout_p": ({"dropout_p": 1.0}, ValueError),
    "rng": ({"dropout_p": 0.5, "rng": 7}, TypeError),
    "dropout_mask": ({"dropout_p": 0.5, "dropout_mask": np.ones((4, 4))}, TypeError),  # a float mask
    "enable_gqa": ({"enable_gqa": "yes"}, TypeError),
    "q_descale": ({"q_descale": "x"}, TypeError),
    "k_descale": ({"k_descale": np.ones((5, 5))}, ValueError),  # not one factor per (batch, head)
    "v_descale": ({"v_descale": np.nan}, ValueError),
    "normalization": ({"normalization": "relu"}, ValueError),
    "sigmoid_bias": ({"normalization": "sigmoid", "sigmoid_bias": np.inf}, ValueError),
}


def test_every_option_has_a_refused_value():
    assert set(BAD) == set(OPTIONS)


@pytest.mark.parametrize("name", CALLS)
def test_the_signature_shows_the_shared_options_with_their_defaults(name):
    _, taken = CALLS[name]
    parameters = inspect.signature(getattr(ar, name)).parameters
    shown = {p.name: p.default for p in parameters.values() if p.name in OPTIONS}
    assert shown == {option: OPTIONS[option] for option in taken}
    assert all(parameters[option].kind is inspect.Parameter.KEYWORD_ONLY for option in taken)
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())  # no **options shown


@pytest.mark.parametrize("name", CALLS)
def test_each_option_reaches_the_checks(name):
    call, taken = CALLS[name]
    for option in taken:
        given, error = BAD[option]
        with pytest.raises(error, match=option):
            call(**given)


@pytest.mark.parametrize("name", CALLS)
def test_options_it_does_not_take_are_refused_by_name(name):
    call, taken = CALLS[name]
    for option in [*(o for o in OPTIONS if o not in taken), "causal"]:
        with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument '{option}'$"):
            call(**{option: OPTIONS.get(option)})


@pytest.mark.parametrize("name", CALLS)
def test_the_defaults_are_the_defaults(name):
    """Omitting the options and passing every default give the same result, bit for bit."""
    call, taken = CALLS[name]
    omitted, explicit = call(), call(**{option: OPTIONS[option] for option in taken})
    for a, b in zip(np.atleast_1d(omitted) if isinstance(omitted, np.ndarray) else omitted,
                    np.atleast_1d(explicit) if isinstance(explicit, np.ndarray) else explicit, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_decorated_function_gets_every_option_it_takes():
    @takes_options("scale", "mask")
    def probe(a, *, own=1, **options):
        return a, own, options

    assert probe(0) == (0, 1, {"mask": None, "scale": None})  # OPTIONS' order, defaults filled in
    assert probe(a=0, own=2, scale=3.0) == (0, 2, {"mask": None, "scale": 3.0})
    assert str(inspect.signature(probe)) == "(a, *, mask=None, scale=None, own=1)"
    with pytest.raises(TypeError, match=r"^probe\(\) got an unexpected keyword argument 'bias'$"):
        probe(0, bias=1.0)


def test_misuse_of_the_decorator_is_refused():
    with pytest.raises(ValueError, match=r"\['causal'\] are not shared options"):
        takes_options("causal")
    with pytest.raises(TypeError, match=r"must end its parameters with \*\*options"):
        takes_options()(lambda q, *, scale=None: q)
    with pytest.raises(TypeError, match=r"declares the shared options \['scale'\] itself"):
        takes_options()(lambda q, *, scale=None, **options: q)

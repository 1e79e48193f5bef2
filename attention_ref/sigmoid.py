"""Sigmoid attention: each weight is the logistic sigmoid of its own score, with no normalisation over the row.

Ramapuram et al. (2024) replace the softmax of the scores by ``sigmoid(x + b)`` elementwise, with a bias
``b = -log S`` (``S`` the number of keys) that keeps the weights of a row summing to about one at the start of
training. `Sigmoid` is that normalization as `scaled_dot_product_attention` and `attention_backward` use it (and
the checkers' naive baseline, which passes its own rounding): the forward weights, the backward through them
and what a row with no allowed key gets, registered in `attention_ref._normalization` as an elementwise
normalization. `sigmoid_weights` is the public form of the forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._validation import as_real_array, check_fits_dtype, check_real, result_dtype

__all__ = ["sigmoid_weights"]

def _keep(x):
    return x


def _logistic(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` elementwise without overflow: exactly 0 at ``-inf``, NaN stays NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(-np.abs(x))  # in (0, 1]: no overflow; 0 at +-inf
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def default_bias(n_keys: int) -> float:
    """``-log S``, the bias of Ramapuram et al. for `n_keys` keys (0 when there are none: no weight to set)."""
    return -math.log(n_keys) if n_keys > 0 else 0.0


@dataclass(frozen=True)
class Sigmoid:
    """The sigmoid normalization with bias `bias`: weights ``sigmoid(x + b)``, a masked score (``-inf``) gives 0."""

    bias: float
    #: The output of a row with no allowed key: every weight is sigmoid(-inf) = 0.
    empty_row = 0.0
    #: The options of ``normalization="sigmoid"`` besides its name.
    OPTIONS = ("sigmoid_bias",)

    @classmethod
    def from_options(cls, options: dict, n_keys: int, dtype) -> Sigmoid:
        """The sigmoid of the checked options: ``sigmoid_bias``, default ``-log S`` for `n_keys` keys ``S``."""
        given = options.get("sigmoid_bias")
        if given is None:
            return cls(default_bias(n_keys))
        bias = check_real(given, "sigmoid_bias")
        check_fits_dtype(bias, "sigmoid_bias", dtype)
        return cls(bias)

    def weights(self, scores: np.ndarray, rnd=_keep) -> np.ndarray:
        """``sigmoid(scores + b)``, shape of `scores`; `rnd` rounds each step (the baseline's dtype)."""
        with np.errstate(invalid="ignore", over="ignore"):  # NaN scores: NaN weights, no warning
            shifted = rnd(scores + scores.dtype.type(self.bias))
        return rnd(_logistic(shifted))

    def score_grad(self, weights: np.ndarray, dweights: np.ndarray, rnd=_keep) -> np.ndarray:
        """The gradient of the scores from that of the weights: ``dS = P (1 - P) dP`` (masked keys: P = 0)."""
        with np.errstate(invalid="ignore", over="ignore"):
            return rnd(rnd(weights * rnd(1 - weights)) * dweights)


def sigmoid_weights(scores, bias=None):
    r"""The weights of sigmoid attention: ``sigmoid(scores + bias)`` elementwise.

    Parameters
    ----------
    scores : array_like, shape (..., L, S)
        Scaled scores with every additive term in them; ``-inf`` marks a
        key the query may not see.
    bias : float, optional
        The bias :math:`b`; default :math:`-\log S`.

    Returns
    -------
    ndarray, shape (..., L, S)
        :math:`\sigma(x_{ij} + b)` with :math:`\sigma(z) = 1 / (1 + e^{-z})`:
        0 for a masked key, so a row with no allowed key is all zeros. The
        rows need not sum to one. In the dtype of `scores` (computed in
        float32 for float16 and bfloat16; float64 for integers).

    Raises
    ------
    TypeError
        If `scores` is not a real array or `bias` not a real number.
    ValueError
        If `bias` is not finite.

    See Also
    --------
    scaled_dot_product_attention : ``normalization="sigmoid"`` uses these weights.

    Notes
    -----
    Ramapuram et al. [1]_ choose :math:`b = -\log S` so that scores near 0
    give weights near :math:`1/S`, as the softmax of equal scores does:
    :math:`\sigma(-\log S) = 1 / (1 + S)`. Each weight depends on its own
    score only, so the derivative is elementwise:
    :math:`\partial P_{ij} / \partial x_{ij} = P_{ij} (1 - P_{ij})`.

    References
    ----------
    .. [1] Ramapuram, J. et al., "Theory, Analysis, and Best Practices for
       Sigmoid Self-Attention", arXiv:2409.04431, 2024.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import sigmoid_weights
    >>> scores = np.array([[0.0, 0.0, 0.0, 0.0], [np.log(3.0), 0.0, -np.inf, -np.inf]])
    >>> sigmoid_weights(scores)
    array([[0.2       , 0.2       , 0.2       , 0.2       ],
           [0.42857143, 0.2       , 0.        , 0.        ]])
    >>> sigmoid_weights(scores, bias=0.0)[0]
    array([0.5, 0.5, 0.5, 0.5])
    """
    scores = as_real_array(scores, "scores")
    out_dtype, work_dtype = result_dtype(scores)
    n_keys = scores.shape[-1] if scores.ndim else 1
    b = default_bias(n_keys) if bias is None else check_real(bias, "bias")
    return Sigmoid(b).weights(scores.astype(work_dtype, copy=False)).astype(out_dtype, copy=False)

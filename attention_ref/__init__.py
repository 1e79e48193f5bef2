r"""attention_ref: an exact, documented reference implementation of attention in NumPy.

Conventions (every function follows them)
-----------------------------------------
Layout
    As PyTorch's ``scaled_dot_product_attention``: queries ``q (..., L, E)``,
    keys ``k (..., S, E)``, values ``v (..., S, Ev)``, output ``(..., L, Ev)``.
    Leading axes broadcast; heads live on axis -3.
Masks
    Boolean, True means "this query may attend to this key" (PyTorch's SDPA
    polarity). A boolean mask becomes an additive 0 / ``-inf`` term before the
    softmax; it is never multiplied in. Additive float terms go in ``bias``.
Causality
    ``is_causal`` aligns the diagonal top-left by default (PyTorch, JAX);
    ``causal_alignment="bottom-right"`` (FlashAttention, KV-cache decoding)
    on request.
Empty rows
    A query row with no allowed key gets zeros in both weights and output:
    never NaN, never a warning.
Scale
    Defaults to ``1/sqrt(E)``, E the query/key size even when ``Ev`` differs;
    ``scale=0.0`` is legal.
Grouped-query attention
    With ``enable_gqa=True`` query head ``h`` uses key/value head
    ``h // (Hq // Hkv)`` (PyTorch's mapping). A head mismatch without it, or
    ``Hq`` not a multiple of ``Hkv``, is an error.
Dtypes
    float16/32/64 in gives the same dtype out, accumulated in at least
    float32; integers become float64. bfloat16 (the NumPy dtype of the
    optional ``ml_dtypes`` package, which JAX uses) is accepted wherever a
    float is, computed in float32 and returned as bfloat16; ml_dtypes is
    imported only when a bfloat16 dtype has to be made from its name. The
    forward attention functions also take float8_e4m3fn and float8_e5m2
    with the descale options ``q_descale``, ``k_descale``, ``v_descale``
    (FlashAttention 3's): they compute the attention of the dequantized
    arrays and return bfloat16 (see `quantize_fp8`). Elsewhere the 8-bit
    and narrower ml_dtypes floats are rejected with a TypeError: convert
    them, exactly, to float32 or bfloat16 first. Dropout needs an explicit
    ``numpy.random.Generator``, or the keep-mask itself as
    ``dropout_mask``.
Multi-head parameters
    Row convention: ``Q = x @ w_q + b_q`` with ``w_q`` of shape
    ``(d_model, n_heads * d_head)``; head ``h`` owns columns
    ``h*d_head:(h+1)*d_head``; the output is ``concat(heads) @ w_o + b_o``.
Threads
    Large problems run independent blocks of queries on a thread per core
    (NumPy releases the GIL in matmul and ufuncs), with BLAS held at one
    thread meanwhile when ``threadpoolctl`` is installed. The environment
    variable ``ATTENTION_REF_NUM_THREADS`` caps the number of threads
    (``1``: everything runs in the calling thread). Results do not depend on
    it beyond rounding.
Errors
    Bad input raises ``ValueError`` (shapes, sizes, choices) or ``TypeError``
    (dtypes, kinds) naming the argument, what it got and what was expected.
"""

from . import testing as testing  # attention_ref.testing.assert_attention_close, like numpy.testing
from .attention import scaled_dot_product_attention
from .backward import AttentionGrads, attention_backward
from .blockwise import blockwise_attention, merge_attention
from .decoding import KVCache, decode_step
from .flex import block_mask_to_dense, flex_attention, flex_attention_backward
from .flex_mods import (
    alibi_score_mod,
    and_masks,
    causal_mask_mod,
    chain_score_mods,
    chunked_mask_mod,
    document_mask_mod,
    noop_mask,
    or_masks,
    prefix_lm_mask_mod,
    relative_bias_score_mod,
    sliding_window_mask_mod,
    softcap_score_mod,
)
from .fp8 import quantize_fp8
from .masks import causal_mask, mask_to_bias, padding_mask, sliding_window_mask
from .multihead import MultiHeadParams, init_multi_head_params, merge_heads, multi_head_attention, split_heads
from .paged import block_table_from_indptr, nhd_to_hnd, paged_attention
from .plotting import check_labels, plot_attention, plot_heads
from .positional import alibi_bias, alibi_slopes, apply_rope, sinusoidal_positions
from .sigmoid import sigmoid_weights
from .softmax import log_softmax, logsumexp, softmax
from .varlen import varlen_attention

__version__ = "0.2.0"

__all__ = [
    "AttentionGrads",
    "KVCache",
    "MultiHeadParams",
    "alibi_bias",
    "alibi_score_mod",
    "alibi_slopes",
    "and_masks",
    "apply_rope",
    "attention_backward",
    "block_mask_to_dense",
    "block_table_from_indptr",
    "blockwise_attention",
    "causal_mask",
    "causal_mask_mod",
    "chain_score_mods",
    "check_labels",
    "chunked_mask_mod",
    "decode_step",
    "document_mask_mod",
    "flex_attention",
    "flex_attention_backward",
    "init_multi_head_params",
    "log_softmax",
    "logsumexp",
    "mask_to_bias",
    "merge_attention",
    "merge_heads",
    "multi_head_attention",
    "nhd_to_hnd",
    "noop_mask",
    "or_masks",
    "padding_mask",
    "paged_attention",
    "plot_attention",
    "plot_heads",
    "prefix_lm_mask_mod",
    "quantize_fp8",
    "relative_bias_score_mod",
    "scaled_dot_product_attention",
    "sigmoid_weights",
    "sinusoidal_positions",
    "sliding_window_mask",
    "sliding_window_mask_mod",
    "softcap_score_mod",
    "softmax",
    "split_heads",
    "varlen_attention",
]

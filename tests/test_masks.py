"""Unit tests for causal_mask, sliding_window_mask, padding_mask and mask_to_bias."""

import numpy as np
import pytest

from attention_ref import causal_mask, mask_to_bias, padding_mask, sliding_window_mask

# --- causal_mask ------------------------------------------------------------


def test_square_causal_mask_is_lower_triangular():
    np.testing.assert_array_equal(causal_mask(4), np.tril(np.ones((4, 4), dtype=bool)))
    assert causal_mask(4).dtype == np.bool_


def test_square_alignments_agree():
    np.testing.assert_array_equal(causal_mask(5, 5, alignment="bottom-right"), causal_mask(5))


def test_top_left_with_fewer_queries_than_keys():
    # Query i sees keys 0..i: the diagonal starts in the top-left corner.
    expected = np.array(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(causal_mask(2, 5), expected)


def test_bottom_right_with_fewer_queries_than_keys():
    # The last query sees every key: the diagonal ends in the bottom-right corner.
    expected = np.array(
        [
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(causal_mask(2, 5, alignment="bottom-right"), expected)


def test_top_left_with_more_queries_than_keys():
    expected = np.array([[1, 0], [1, 1], [1, 1], [1, 1]], dtype=bool)
    np.testing.assert_array_equal(causal_mask(4, 2), expected)


def test_bottom_right_with_more_queries_than_keys_has_empty_leading_rows():
    # Query i sits at key position i + S - L = i - 2: rows 0 and 1 see nothing.
    expected = np.array([[0, 0], [0, 0], [1, 0], [1, 1]], dtype=bool)
    np.testing.assert_array_equal(causal_mask(4, 2, alignment="bottom-right"), expected)


@pytest.mark.parametrize("n_queries", [0, 1, 3, 6])
@pytest.mark.parametrize("n_keys", [0, 1, 4, 6])
def test_causal_mask_matches_tril_with_offset(n_queries, n_keys):
    ones = np.ones((n_queries, n_keys), dtype=bool)
    np.testing.assert_array_equal(causal_mask(n_queries, n_keys), np.tril(ones, k=0))
    np.testing.assert_array_equal(
        causal_mask(n_queries, n_keys, alignment="bottom-right"), np.tril(ones, k=n_keys - n_queries)
    )


def test_numpy_integers_are_accepted():
    np.testing.assert_array_equal(causal_mask(np.int64(2), np.int32(3)), causal_mask(2, 3))


# --- sliding_window_mask ----------------------------------------------------


def test_sliding_window_by_hand():
    expected = np.array(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(sliding_window_mask(5, window=3), expected)


def test_window_one_is_the_diagonal_and_large_window_is_causal():
    np.testing.assert_array_equal(sliding_window_mask(4, window=1), np.eye(4, dtype=bool))
    for alignment in ("top-left", "bottom-right"):
        np.testing.assert_array_equal(
            sliding_window_mask(3, 7, window=7, alignment=alignment), causal_mask(3, 7, alignment=alignment)
        )


@pytest.mark.parametrize("shape", [(3, 7), (7, 3), (4, 4)])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("window", [1, 2, 5])
def test_sliding_window_matches_band_of_two_trils(shape, alignment, window):
    L, S = shape
    offset = 0 if alignment == "top-left" else S - L
    ones = np.ones(shape, dtype=bool)
    band = np.tril(ones, k=offset) & ~np.tril(ones, k=offset - window)
    np.testing.assert_array_equal(sliding_window_mask(L, S, window=window, alignment=alignment), band)


def test_window_pair_by_hand():
    # Query i sees keys i - 1 .. i + 2.
    expected = np.array(
        [
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [0, 1, 1, 1, 1],
            [0, 0, 1, 1, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(sliding_window_mask(4, 5, window=(1, 2)), expected)
    # Bottom-right: query i sits at key position i + 1.
    np.testing.assert_array_equal(sliding_window_mask(4, 5, window=[2, 1], alignment="bottom-right"), expected)


@pytest.mark.parametrize("shape", [(3, 7), (7, 3), (4, 4), (0, 3), (3, 0)])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("window", [1, 2, 5])
def test_int_window_is_the_pair_window_minus_one_and_zero(shape, alignment, window):
    L, S = shape
    np.testing.assert_array_equal(
        sliding_window_mask(L, S, window=window, alignment=alignment),
        sliding_window_mask(L, S, window=(window - 1, 0), alignment=alignment),
    )


@pytest.mark.parametrize("shape", [(3, 7), (7, 3), (4, 4)])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("left", [None, 0, 1, 3, 10])
@pytest.mark.parametrize("right", [None, 0, 2, 10])
def test_window_pair_matches_band_of_two_trils(shape, alignment, left, right):
    L, S = shape
    offset = 0 if alignment == "top-left" else S - L
    ones = np.ones(shape, dtype=bool)
    below = ones if right is None else np.tril(ones, k=offset + right)  # j <= p + right
    above = ones if left is None else ~np.tril(ones, k=offset - left - 1)  # j >= p - left
    got = sliding_window_mask(L, S, window=(left, right), alignment=alignment)
    np.testing.assert_array_equal(got, below & above)


def test_unbounded_window_sides():
    np.testing.assert_array_equal(sliding_window_mask(3, 5, window=(None, None)), np.ones((3, 5), dtype=bool))
    for alignment in ("top-left", "bottom-right"):
        np.testing.assert_array_equal(
            sliding_window_mask(3, 5, window=(None, 0), alignment=alignment), causal_mask(3, 5, alignment=alignment)
        )
    np.testing.assert_array_equal(sliding_window_mask(4, window=(0, None)), np.triu(np.ones((4, 4), dtype=bool)))


@pytest.mark.parametrize(
    ("window", "error", "match"),
    [
        ((1,), ValueError, r"^window must be a pair"),
        ((1, 2, 3), ValueError, r"^window must be a pair"),
        ((-1, 0), ValueError, r"^window\[0\] \(left\) must be >= 0; got -1"),
        ((0, -2), ValueError, r"^window\[1\] \(right\) must be >= 0; got -2"),
        ((1.0, 0), TypeError, r"^window\[0\] \(left\) must be an integer"),
        (("1", 0), TypeError, r"^window\[0\] \(left\) must be an integer"),
        (0, ValueError, r"^window must be >= 1"),
    ],
)
def test_bad_window_pairs(window, error, match):
    with pytest.raises(error, match=match):
        sliding_window_mask(3, window=window)


# --- padding_mask -----------------------------------------------------------


def test_padding_mask_by_hand():
    expected = np.array([[[1, 1, 1, 0]], [[1, 0, 0, 0]], [[0, 0, 0, 0]], [[1, 1, 1, 1]]], dtype=bool)
    got = padding_mask([3, 1, 0, 4], 4)
    assert got.shape == (4, 1, 4)
    np.testing.assert_array_equal(got, expected)


def test_padding_mask_shapes():
    assert padding_mask(2, 3).shape == (1, 3)
    assert padding_mask(np.array([[1, 2], [3, 0]]), 3).shape == (2, 2, 1, 3)
    assert padding_mask(np.array([], dtype=int), 3).shape == (0, 1, 3)
    assert padding_mask([0, 0], 0).shape == (2, 1, 0)


def test_padding_mask_broadcasts_against_scores_and_combines_with_causal():
    B, L, S = 2, 3, 4
    combined = padding_mask([2, 4], S) & causal_mask(L, S, alignment="bottom-right")
    assert combined.shape == (B, L, S)
    # sequence 0: keys 2, 3 are padding everywhere
    assert not combined[0, :, 2:].any()
    np.testing.assert_array_equal(combined[1], causal_mask(L, S, alignment="bottom-right"))


def test_padding_mask_accepts_unsigned_lengths():
    np.testing.assert_array_equal(padding_mask(np.array([1], dtype=np.uint8), 2), [[[True, False]]])
    # n_keys - lengths must not wrap around in the unsigned type
    left = padding_mask(np.array([1, 0], dtype=np.uint8), 300, side="left")
    assert left.sum(axis=-1).ravel().tolist() == [1, 0] and left[0, 0, -1]


def test_left_padding_by_hand():
    expected = np.array([[[0, 1, 1, 1]], [[0, 0, 0, 1]], [[0, 0, 0, 0]], [[1, 1, 1, 1]]], dtype=bool)
    got = padding_mask([3, 1, 0, 4], 4, side="left")
    assert got.shape == (4, 1, 4)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("lengths", [[0], [2, 5], [[1, 3], [5, 0]]])
def test_left_padding_is_right_padding_reversed(lengths):
    np.testing.assert_array_equal(padding_mask(lengths, 5, side="left"), padding_mask(lengths, 5)[..., ::-1])
    np.testing.assert_array_equal(padding_mask(lengths, 5, side="right"), padding_mask(lengths, 5))


def test_left_padding_lines_up_bottom_right_causal_masks():
    # With the real keys at the end, the bottom-right causal mask restricted to a sequence's real keys is the
    # causal mask of that sequence alone (queries are never padded here: they are the newest positions).
    L, S = 2, 5
    for length in range(L, S + 1):
        combined = padding_mask([length], S, side="left")[0] & causal_mask(L, S, alignment="bottom-right")
        np.testing.assert_array_equal(combined[:, S - length :], causal_mask(L, length, alignment="bottom-right"))
        assert not combined[:, : S - length].any()


@pytest.mark.parametrize("side", ["both", "Left", None, 1])
def test_padding_side_must_be_left_or_right(side):
    with pytest.raises(ValueError, match=r"^side must be one of 'right', 'left'; got"):
        padding_mask([1], 3, side=side)


# --- mask_to_bias -----------------------------------------------------------


def test_mask_to_bias_values_and_default_dtype():
    bias = mask_to_bias(np.array([[True, False], [False, True]]))
    assert bias.dtype == np.float64
    np.testing.assert_array_equal(bias, [[0.0, -np.inf], [-np.inf, 0.0]])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, "float32"])
def test_mask_to_bias_dtypes(dtype):
    bias = mask_to_bias(causal_mask(3), dtype=dtype)
    assert bias.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.isneginf(bias), ~causal_mask(3))
    np.testing.assert_array_equal(bias[causal_mask(3)], 0)


def test_mask_to_bias_keeps_shape_and_accepts_lists():
    assert mask_to_bias([True, False]).shape == (2,)
    assert mask_to_bias(np.ones((2, 1, 3, 4), dtype=bool)).shape == (2, 1, 3, 4)
    assert mask_to_bias(np.True_).shape == ()

"""fp8 inputs with descales (attention_ref/fp8.py): dequantized exactly, bfloat16 out, checked by FA3's rule."""

import numpy as np
import pytest
from conftest import require
from test_paged import gathered

import attention_ref as ar
from attention_ref import nhd_to_hnd, paged_attention, quantize_fp8, scaled_dot_product_attention, varlen_attention
from attention_ref.fp8 import FP8_MAX
from attention_ref.testing import assert_attention_close, assert_lse_close

FORMATS = ["float8_e4m3fn", "float8_e5m2"]


@pytest.fixture(autouse=True)
def _ml_dtypes():
    require("ml_dtypes")


def fp8_problem(seed, fmt="float8_e4m3fn", *, B=2, Hq=4, Hkv=2, L=48, S=64, E=32):
    """Quantized q, k, v (one descale per batch entry and head) and the descale options (q's per key/value head)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, L, E))
    k = rng.standard_normal((B, Hkv, S, E))
    v = 3.0 * rng.standard_normal((B, Hkv, S, E))
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(x, fmt, per_head=True) for x in (q, k, v))
    qd = qd.reshape(B, Hkv, Hq // Hkv).max(axis=-1)  # FA3's q_descale is (B, Hkv): one factor per group
    q8 = (q / np.repeat(qd, Hq // Hkv, axis=1)[..., None, None]).astype(q8.dtype)  # quantized with it
    return q8, k8, v8, {"q_descale": qd, "k_descale": kd, "v_descale": vd, "enable_gqa": Hq != Hkv}


def dequantized(q8, k8, v8, options):
    """The arrays the fp8 inputs stand for, written out: x8 in float64 times its descale (q's per group)."""
    groups = q8.shape[1] // k8.shape[1]
    qd = np.repeat(options["q_descale"], groups, axis=1)[..., None, None]
    return (q8.astype(np.float64) * qd, k8.astype(np.float64) * options["k_descale"][..., None, None],
            v8.astype(np.float64) * options["v_descale"][..., None, None])


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_round_trip(fmt):
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 8)) * np.array([1.0, 10.0, 0.01])[:, None, None]
    for per_head in (False, True):
        x8, descale = quantize_fp8(x, fmt, per_head=per_head)
        assert x8.dtype.name == fmt
        back = x8.astype(np.float64) * (descale[..., None, None] if per_head else descale)
        # amax lands on the format's largest value; every entry within half a spacing of fp8 (relative)
        rel = {"float8_e4m3fn": 2.0**-4, "float8_e5m2": 2.0**-3}[fmt]
        scale = np.abs(x).max(axis=(-2, -1), keepdims=True) if per_head else np.abs(x).max()
        assert np.all(np.abs(back - x) <= rel * np.maximum(np.abs(x), scale * 2.0**-6) + 1e-12)
        np.testing.assert_allclose(np.abs(back).max(), np.abs(x).max(), rtol=1e-6)
    zeros8, d = quantize_fp8(np.zeros((2, 2)))
    assert float(d) == 1.0 and not zeros8.astype(np.float32).any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_attention_of_the_dequantized_arrays_in_bfloat16(fmt):
    q8, k8, v8, options = fp8_problem(1, fmt)
    out = scaled_dot_product_attention(q8, k8, v8, is_causal=True, **options)
    assert out.dtype.name == "bfloat16"
    q, k, v = dequantized(q8, k8, v8, options)
    ref = scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = ref.astype(out.dtype)  # the exact attention, rounded once to bfloat16
    assert np.abs(out.astype(np.float64) - expected.astype(np.float64)).max() <= 2.0**-8 * np.abs(ref).max()
    out_b, lse = ar.blockwise_attention(q8, k8, v8, is_causal=True, return_lse=True, **options)
    assert out_b.dtype.name == "bfloat16"
    np.testing.assert_allclose(lse, scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                                 return_lse=True)[1], rtol=1e-12)


def test_float8_without_descales_has_descale_one():
    q8, k8, v8, _ = fp8_problem(2)
    out = scaled_dot_product_attention(q8, k8, v8, enable_gqa=True)
    ref = scaled_dot_product_attention(*(x.astype(np.float64) for x in (q8, k8, v8)), enable_gqa=True)
    np.testing.assert_array_equal(out, ref.astype(out.dtype))


def test_scalar_descales():
    q8, k8, v8, _ = fp8_problem(3)
    out = scaled_dot_product_attention(q8, k8, v8, enable_gqa=True, q_descale=0.5, k_descale=2.0, v_descale=0.25)
    q, k, v = (x.astype(np.float64) for x in (q8, k8, v8))
    ref = scaled_dot_product_attention(q * 0.5, k * 2.0, v * 0.25, enable_gqa=True)
    np.testing.assert_array_equal(out, ref.astype(out.dtype))


def test_varlen_and_paged_take_a_descale_row_per_sequence():
    rng = np.random.default_rng(4)
    lens = [5, 0, 9]
    k = rng.standard_normal((2, 14, 8))
    k8, _ = quantize_fp8(k)
    v8, _ = quantize_fp8(rng.standard_normal((2, 14, 8)))
    q8, _ = quantize_fp8(rng.standard_normal((2, 3, 8)))
    kd = np.array([[0.5, 1.0], [2.0, 4.0], [0.25, 0.125]], dtype=np.float32)  # (B, Hkv)
    cu_k = np.array([0, 5, 5, 14])
    out = varlen_attention(q8, k8, v8, [0, 1, 2, 3], cu_k, k_descale=kd)
    assert out.dtype.name == "bfloat16"
    for b in range(3):
        want = scaled_dot_product_attention(q8[:, b : b + 1], k8[:, cu_k[b] : cu_k[b + 1]],
                                            v8[:, cu_k[b] : cu_k[b + 1]], k_descale=kd[b])
        np.testing.assert_array_equal(out[:, b : b + 1], want)
    # the same keys in pages of 4 (HND), sequence b on pages table[b]
    pages_k = np.zeros((8, 2, 4, 8), dtype=k8.dtype)
    pages_v = np.zeros((8, 2, 4, 8), dtype=v8.dtype)
    table = np.array([[3, 6, -1], [0, 0, 0], [1, 7, 2]])
    for b, n in enumerate(lens):
        for j in range(n):
            pages_k[table[b, j // 4], :, j % 4] = k8[:, cu_k[b] + j]
            pages_v[table[b, j // 4], :, j % 4] = v8[:, cu_k[b] + j]
    paged = paged_attention(q8, pages_k, pages_v, table, lens, cu_seqlens_q=[0, 1, 2, 3], k_descale=kd)
    np.testing.assert_array_equal(paged, out)
    with pytest.raises(ValueError, match=r"^k_descale must have one row per sequence; got shape \(2, 2\)"):
        varlen_attention(q8, k8, v8, [0, 1, 2, 3], cu_k, k_descale=kd[:2])


# --- page pools: one descale per head, both layouts --------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("layout", "axis", "shape"), [("HND", 1, (1, 3, 1, 1)), ("NHD", 2, (1, 1, 3, 1)),
                                                         ("NHD", -2, (1, 1, 3, 1))])
def test_quantize_a_pool_per_head(fmt, layout, axis, shape):
    # 6 pages of 4 positions, 3 heads of very different sizes, head 1's amax in one page only
    rng = np.random.default_rng(8)
    pool = rng.uniform(-1.0, 1.0, (6, 3, 4, 8)) * np.array([1.0, 50.0, 0.02])[:, None, None]  # HND
    pool[4, 1, 2, 3] = -200.0
    x = pool if layout == "HND" else np.swapaxes(pool, 1, 2)
    x8, descale = quantize_fp8(x, fmt, per_head=True, axis=axis)
    assert descale.shape == shape and descale.dtype == np.float32 and x8.shape == x.shape
    amax = np.abs(pool.astype(np.float32)).max(axis=(0, 2, 3))  # (H,): every page, position and feature
    assert amax[1] == 200.0
    np.testing.assert_array_equal(descale.ravel(), amax / np.float32(FP8_MAX[fmt]))
    heads = np.moveaxis(np.abs(x8.astype(np.float64)), axis, 0).reshape(3, -1)  # (H, everything else)
    np.testing.assert_array_equal(heads.max(axis=1), FP8_MAX[fmt])  # each head's amax lands on the fp8 max
    back = x8.astype(np.float64) * descale  # the descale broadcasts against the pool as it is
    rel = {"float8_e4m3fn": 2.0**-4, "float8_e5m2": 2.0**-3}[fmt]
    assert np.all(np.abs(back - x) <= rel * np.abs(x) + amax.reshape(shape) * 2.0**-10)


def test_a_pool_without_axis_is_not_quantized_per_head():
    pool = np.random.default_rng(9).standard_normal((6, 3, 4, 8))
    _, per_page_and_head = quantize_fp8(pool, per_head=True)  # read as (B, H, L, E)
    assert per_page_and_head.shape == (6, 3)
    _, per_head = quantize_fp8(pool, per_head=True, axis=1)
    np.testing.assert_array_equal(per_head.ravel(), per_page_and_head.max(axis=0))


def paged_fp8_problem(seed, fmt, layout, *, B=3, Hq=4, Hkv=2, page_size=4, E=16):
    """A quantized pool (per head, in `layout`), its descales, fp8 queries with a (B, Hkv) descale, table and lens."""
    rng = np.random.default_rng(seed)
    lens = np.array([9, 0, 5])[:B]
    num_pages = 7
    table = np.array([[5, 1, 3], [0, 0, 0], [6, 2, -1]])[:B]
    k = rng.standard_normal((num_pages, Hkv, page_size, E)) * np.array([1.0, 8.0])[:, None, None]  # HND
    v = 3.0 * rng.standard_normal((num_pages, Hkv, page_size, E))
    if layout == "NHD":
        k, v = np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2)
    axis = {"HND": 1, "NHD": 2}[layout]
    (k8, kd), (v8, vd) = (quantize_fp8(a, fmt, per_head=True, axis=axis) for a in (k, v))
    q = rng.standard_normal((B, Hq, 2, E))
    qd = np.full((B, Hkv), np.abs(q).max() / FP8_MAX[fmt], dtype=np.float32)
    q8 = (q / qd[0, 0]).astype(k8.dtype)
    return q8, k8, v8, table, lens, {"q_descale": qd, "k_descale": kd, "v_descale": vd}


@pytest.mark.parametrize("fmt", FORMATS)
def test_paged_fp8_pools_in_both_layouts(fmt):
    q8, k8, v8, table, lens, descales = paged_fp8_problem(10, fmt, "HND")
    options = {"enable_gqa": True, "is_causal": True, "causal_alignment": "bottom-right"}
    hnd = paged_attention(q8, k8, v8, table, lens, **descales, **options)
    assert hnd.dtype.name == "bfloat16"
    # the reference: the pool dequantized in float64 (exactly), gathered, attended, rounded once to bfloat16
    k, v = (a8.astype(np.float64) * d for a8, d in ((k8, descales["k_descale"]), (v8, descales["v_descale"])))
    q = q8.astype(np.float64) * descales["q_descale"][0, 0]
    for b, n in enumerate(lens):
        want = scaled_dot_product_attention(q[b], gathered(k, table, b, n), gathered(v, table, b, n), **options)
        np.testing.assert_array_equal(hnd[b], want.astype(hnd.dtype))
    # the same pool quantized in the NHD order: the same fp8 bits, the same descales, the same output
    q8n, k8n, v8n, _, _, nhd_descales = paged_fp8_problem(10, fmt, "NHD")
    np.testing.assert_array_equal(np.swapaxes(k8n, 1, 2).view(np.uint8), k8.view(np.uint8))
    np.testing.assert_array_equal(nhd_descales["k_descale"].ravel(), descales["k_descale"].ravel())
    nhd = paged_attention(q8n, k8n, v8n, table, lens, layout="NHD", **nhd_descales, **options)
    np.testing.assert_array_equal(nhd, hnd)
    # nhd_to_hnd turns the NHD pool and its per-head descales, (1, 1, Hkv, 1), into HND ones, (1, Hkv, 1, 1)
    moved = {name: nhd_to_hnd(d) if d.ndim == 4 else d for name, d in nhd_descales.items()}
    np.testing.assert_array_equal(paged_attention(q8n, nhd_to_hnd(k8n), nhd_to_hnd(v8n), table, lens, **moved,
                                                  **options), hnd)


def test_paged_takes_every_shape_of_a_per_head_descale():
    q8, k8, v8, table, lens, descales = paged_fp8_problem(11, "float8_e4m3fn", "NHD")
    kd, vd = descales["k_descale"], descales["v_descale"]  # (1, 1, Hkv, 1)
    base = {"q_descale": descales["q_descale"], "enable_gqa": True, "layout": "NHD"}
    want = paged_attention(q8, k8, v8, table, lens, k_descale=np.tile(kd.reshape(1, 2), (3, 1)),
                           v_descale=np.tile(vd.reshape(1, 2), (3, 1)), **base)  # FlashAttention 3's (B, Hkv)
    for shape in ((1, 1, 2, 1), (2,), (1, 2)):
        got = paged_attention(q8, k8, v8, table, lens, k_descale=kd.reshape(shape), v_descale=vd.reshape(shape),
                              **base)
        np.testing.assert_array_equal(got, want)
    q_one = paged_attention(q8, k8, v8, table, lens, k_descale=kd, v_descale=vd,
                            **(base | {"q_descale": descales["q_descale"][0]}))  # (Hkv,) for q too
    np.testing.assert_array_equal(q_one, want)
    wrong_scale = paged_attention(q8, k8, v8, table, lens, k_descale=kd, v_descale=vd * 2, **base)
    assert not np.array_equal(wrong_scale, want)  # the descale is applied, not ignored
    # no sequences: a (0, Hkv) descale, or one that broadcasts to it, has no row to give and needs none
    empty = paged_attention(q8[:0], k8, v8, table[:0], lens[:0], k_descale=kd, v_descale=np.ones((0, 2)),
                            **(base | {"q_descale": 1.0}))
    assert empty.shape == (0, 4, 2, 16) and empty.dtype.name == "bfloat16"


@pytest.mark.parametrize(
    ("layout", "name", "descale", "match"),
    [
        ("NHD", "k_descale", np.ones((1, 2, 1, 1)), r"^k_descale must be a scalar, or broadcast to \(B, Hkv\) = "
         r"\(3, 2\).*per-head descale of the NHD pool, \(1, 1, 2, 1\); got shape \(1, 2, 1, 1\)"),
        ("HND", "v_descale", np.ones((7, 2, 1, 1)), r"^v_descale must be .*\(1, 2, 1, 1\); got shape \(7, 2, 1, 1\)"),
        ("HND", "k_descale", np.ones((4, 2)), r"^k_descale must be a scalar, or broadcast to \(B, Hkv\)"),
        ("HND", "k_descale", np.ones(3), r"^k_descale .*got shape \(3,\)$"),
        ("HND", "k_descale", np.ones((1, 3, 2)), r"^k_descale .*got shape \(1, 3, 2\)$"),
        ("HND", "q_descale", np.ones((1, 2, 1, 1)), r"^q_descale must be .*\(3, 2\): .* per head\); got shape"),
    ],
)
def test_paged_descale_of_the_wrong_shape(layout, name, descale, match):
    q8, k8, v8, table, lens, _ = paged_fp8_problem(12, "float8_e4m3fn", layout)
    with pytest.raises(ValueError, match=match):
        paged_attention(q8, k8, v8, table, lens, layout=layout, enable_gqa=True, **{name: descale})


@pytest.mark.torch
def test_paged_takes_a_torch_fp8_nhd_pool():
    torch = require("torch")
    q8, k8, v8, table, lens, descales = paged_fp8_problem(13, "float8_e4m3fn", "NHD")
    want = paged_attention(q8, k8, v8, table, lens, layout="NHD", enable_gqa=True, **descales)

    def tensor(a8):
        return torch.from_numpy(np.ascontiguousarray(a8).view(np.uint8)).view(torch.float8_e4m3fn)

    got = paged_attention(tensor(q8), tensor(k8), tensor(v8), torch.from_numpy(table), torch.from_numpy(lens),
                          layout="NHD", enable_gqa=True,
                          **{name: torch.from_numpy(d) for name, d in descales.items()})
    assert got.dtype.name == "bfloat16"
    np.testing.assert_array_equal(got, want)


# --- the checker: FlashAttention 3's baseline -----------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_checker_passes_correct_fp8_kernels(seed):
    q8, k8, v8, options = fp8_problem(seed)
    options |= {"is_causal": True, "sinks": np.array([0.5, 1.0, -1.0, 2.0])}
    for kernel in (scaled_dot_product_attention, ar.blockwise_attention):
        assert_attention_close(kernel(q8, k8, v8, **options), q8, k8, v8, **options)
    _, lse = ar.blockwise_attention(q8, k8, v8, return_lse=True, **options)
    assert_lse_close(lse, q8, k8, v8, **options)


@pytest.mark.parametrize("breakage", ["k_descale x 1.25", "v_descale x 1.1", "q_descale of head 0", "dropped sink"])
def test_checker_fails_broken_fp8_kernels(breakage):
    q8, k8, v8, options = fp8_problem(7)
    options |= {"sinks": np.array([3.0, 4.0, 2.0, 5.0])}  # each about a tenth or more of its rows' weight
    wrong = dict(options)
    if breakage == "k_descale x 1.25":
        wrong["k_descale"] = options["k_descale"] * 1.25
    elif breakage == "v_descale x 1.1":
        wrong["v_descale"] = options["v_descale"] * 1.1
    elif breakage == "q_descale of head 0":
        wrong["q_descale"] = np.broadcast_to(options["q_descale"][:, :1], options["q_descale"].shape)
    else:
        del wrong["sinks"]
    out = ar.blockwise_attention(q8, k8, v8, **wrong)
    with pytest.raises(AssertionError, match="elements are too far from the float64 reference"):
        assert_attention_close(out, q8, k8, v8, **options)


def test_descales_by_batch_entry_and_group_written_out_one_head_at_a_time():
    # Independent of dequantize_inputs (which the checker uses too): every head dequantized by its own loop,
    # query head h by the descale of its group h // 3, batch entry b by row b. The kernels and the checker must
    # agree with it. B = Hkv, so descales read with their axes swapped would still broadcast.
    q8, k8, v8, options = fp8_problem(12, B=2, Hq=6, Hkv=2, L=16, S=24, E=16)
    for name in ("q_descale", "k_descale", "v_descale"):  # every factor its own: no axis or group can stand in
        assert np.unique(options[name]).size == 4, name
    q, k, v = (np.empty(a.shape) for a in (q8, k8, v8))
    for b in range(2):
        for h in range(6):
            q[b, h] = q8[b, h].astype(np.float64) * float(options["q_descale"][b, h // 3])
        for h in range(2):
            k[b, h] = k8[b, h].astype(np.float64) * float(options["k_descale"][b, h])
            v[b, h] = v8[b, h].astype(np.float64) * float(options["v_descale"][b, h])
    ref = scaled_dot_product_attention(q, k, v, enable_gqa=True)
    exact = ref.astype(require("ml_dtypes").bfloat16)  # a kernel that rounds once, at the end
    for kernel in (scaled_dot_product_attention, ar.blockwise_attention):
        out = kernel(q8, k8, v8, **options)
        assert np.abs(out.astype(np.float64) - ref).max() <= 2.0**-8 * np.abs(ref).max(), kernel.__name__
    assert_attention_close(exact, q8, k8, v8, **options)
    _, lse = ar.blockwise_attention(q8, k8, v8, return_lse=True, **options)
    np.testing.assert_allclose(lse, scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True)[1],
                               rtol=1e-12)


def test_the_fp8_baseline_rounds_the_weights_to_fp8():
    # FA3's intermediate_dtype: a baseline without that rounding is several times closer to the reference.
    from attention_ref.testing._baseline import naive_attention
    from attention_ref.testing._variants import dequantized

    q8, k8, v8, options = fp8_problem(5)
    q, k, v, plain, fp8 = dequantized(q8, k8, v8, options)
    assert fp8 == q8.dtype
    bf16 = np.dtype(require("ml_dtypes").bfloat16)
    ref = scaled_dot_product_attention(q, k, v, **plain)
    with_fp8 = np.abs(naive_attention(q, k, v, bf16, plain, intermediate=fp8).astype(np.float64) - ref).max()
    without = np.abs(naive_attention(q, k, v, bf16, plain).astype(np.float64) - ref).max()
    assert with_fp8 > 2 * without


def test_sdpa_takes_the_per_head_descale_quantize_fp8_gives_with_axis_as_its_b_hkv_shape():
    q8, k8, v8, options = fp8_problem(5)
    k = k8.astype(np.float64) * options["k_descale"][..., None, None]
    k8_head, kd_head = quantize_fp8(k, per_head=True, axis=1)  # one factor per key/value head: (1, Hkv, 1, 1)
    assert kd_head.shape == (1, 2, 1, 1)
    base = {name: options[name] for name in ("q_descale", "v_descale", "enable_gqa")}
    want = scaled_dot_product_attention(q8, k8_head, v8, k_descale=kd_head.reshape(1, 2), **base)  # (1, Hkv)
    np.testing.assert_array_equal(scaled_dot_product_attention(q8, k8_head, v8, k_descale=kd_head, **base), want)
    by_batch = np.concatenate([kd_head, 2 * kd_head])  # (B, Hkv, 1, 1): the second batch entry's keys doubled
    doubled = scaled_dot_product_attention(q8, k8_head, v8, k_descale=by_batch, **base)
    np.testing.assert_array_equal(doubled[0], want[0])
    np.testing.assert_array_equal(
        doubled[1], scaled_dot_product_attention(q8[1:], k8_head[1:], v8[1:], k_descale=2 * kd_head,
                                                 **(base | {"q_descale": base["q_descale"][1:],
                                                            "v_descale": base["v_descale"][1:]}))[0])
    with pytest.raises(ValueError, match=r"^k_descale must be a scalar or hold one factor per batch entry and "
                                         r"key/value head, \(B, Hkv\).*\(1, Hkv, 1, 1\).*got \(1, 2, 3, 1\)$"):
        scaled_dot_product_attention(q8, k8_head, v8, k_descale=np.ones((1, 2, 3, 1)), **base)


def test_quantize_fp8_takes_the_format_as_an_ml_dtypes_dtype():
    ml_dtypes = require("ml_dtypes")
    x = np.linspace(-3.0, 3.0, 7)
    for fmt in FORMATS:
        by_name = quantize_fp8(x, fmt)
        for spelled in (getattr(ml_dtypes, fmt), np.dtype(getattr(ml_dtypes, fmt))):
            x8, descale = quantize_fp8(x, spelled)
            assert x8.dtype.name == fmt and descale == by_name[1]
            np.testing.assert_array_equal(x8.astype(np.float64), by_name[0].astype(np.float64))


@pytest.mark.torch
def test_quantize_fp8_takes_torch_fp8_dtypes_and_refuses_the_fnuz_ones():
    torch = require("torch")
    x = np.linspace(-3.0, 3.0, 7)
    for fmt in FORMATS:
        assert quantize_fp8(x, getattr(torch, fmt))[0].dtype.name == fmt
    for other in ("float8_e4m3fnuz", "float8_e5m2fnuz"):
        with pytest.raises(ValueError, match=rf"^dtype must be one of 'float8_e4m3fn', 'float8_e5m2' .*; "
                                             rf"got torch.{other}$"):
            quantize_fp8(x, getattr(torch, other))


# --- bad input ------------------------------------------------------------------


def test_descale_bad_input():
    q8, k8, v8, _ = fp8_problem(0)
    with pytest.raises(ValueError, match=r"^k_descale must be a scalar or hold one factor per batch entry"):
        scaled_dot_product_attention(q8, k8, v8, enable_gqa=True, k_descale=np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"^v_descale must be finite"):
        scaled_dot_product_attention(q8, k8, v8, enable_gqa=True, v_descale=np.nan)
    with pytest.raises(TypeError, match=r"^q_descale must hold real numbers"):
        scaled_dot_product_attention(q8, k8, v8, enable_gqa=True, q_descale="x")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'q_descale'"):
        ar.attention_backward(q8, k8, v8, np.zeros((2, 4, 48, 32)), q_descale=1.0)
    with pytest.raises(TypeError, match=r"^q has dtype float8_e4m3fn, a storage format"):
        ar.attention_backward(q8, k8, v8, np.zeros((2, 4, 48, 32)), enable_gqa=True)
    with pytest.raises(ValueError, match=r"^dtype must be one of"):
        quantize_fp8(np.ones(3), "float8_e4m3")
    with pytest.raises(ValueError, match=r"^x must be 4-D \(B, H, L, E\) for per_head=True"):
        quantize_fp8(np.ones(3), per_head=True)
    with pytest.raises(ValueError, match=r"^x must be finite"):
        quantize_fp8(np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match=r"^axis names the head axis of per_head=True; got axis=1 with per_head=False"):
        quantize_fp8(np.ones((2, 3)), axis=1)
    for axis in (2, -3):
        with pytest.raises(ValueError, match=rf"^axis={axis} is out of range for an array with 2 dimensions"):
            quantize_fp8(np.ones((2, 3)), per_head=True, axis=axis)
    with pytest.raises(TypeError, match=r"^axis must be an integer; got 1.0"):
        quantize_fp8(np.ones((2, 3)), per_head=True, axis=1.0)
    with pytest.raises(TypeError, match=r"^per_head must be True or False; got 1"):
        quantize_fp8(np.ones((2, 3)), per_head=1)

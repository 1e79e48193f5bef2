"""attention_ref.testing.assert_paged_attention_close: a paged-cache kernel checked sequence by sequence."""

import numpy as np
import pytest
from conftest import require

import attention_ref as ar
from attention_ref.testing import assert_paged_attention_close


def pools(seed=0, pages=7, Hkv=2, page=4, E=16, dtype=np.float16):
    rng = np.random.default_rng(seed)
    k_pages, v_pages = (rng.standard_normal((pages, Hkv, page, E)).astype(dtype) for _ in range(2))
    table = np.array([[3, 0, 5], [6, 1, -1], [2, 4, -1], [-1, -1, -1]])
    lens = np.array([10, 5, 8, 0])
    return k_pages, v_pages, table, lens


def test_a_correct_kernel_passes_and_a_broken_sequence_is_named():
    k_pages, v_pages, table, lens = pools()
    q = np.random.default_rng(1).standard_normal((4, 4, 3, 16)).astype(np.float16)
    options = {"is_causal": True, "causal_alignment": "bottom-right", "enable_gqa": True}
    out = ar.paged_attention(q, k_pages, v_pages, table, lens, **options)
    assert_paged_attention_close(out, q, k_pages, v_pages, table, lens, **options)
    wrong = out.copy()
    wrong[2] = ar.paged_attention(q, k_pages, v_pages, table, lens - 1 + (lens == 0), **options)[2]
    with pytest.raises(AssertionError, match=r"^sequence 2: \d+ of 192 elements") as info:
        assert_paged_attention_close(wrong, q, k_pages, v_pages, table, lens, **options)
    assert "sequence 0" not in str(info.value) and "sequence 1" not in str(info.value)


def test_nhd_pools_packed_queries_and_fp8_with_descales():
    ml_dtypes = require("ml_dtypes")
    k_pages, v_pages, table, lens = pools(2, dtype=np.float32)
    k_nhd, v_nhd = np.swapaxes(k_pages, 1, 2), np.swapaxes(v_pages, 1, 2)  # (pages, page_size, Hkv, E)
    k8, k_scale = ar.quantize_fp8(k_nhd, per_head=True, axis=2)
    v8, v_scale = ar.quantize_fp8(v_nhd, per_head=True, axis=2)
    assert k8.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and k_scale.shape == (1, 1, 2, 1)
    cu = np.array([0, 2, 3, 6, 6])
    q = np.random.default_rng(3).standard_normal((2, 6, 16)).astype(np.float32)
    options = {"k_descale": k_scale, "v_descale": v_scale, "cu_seqlens_q": cu}
    out = ar.paged_attention(q, k8, v8, table, lens, layout="NHD", **options)
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    assert_paged_attention_close(out, q, k8, v8, table, lens, layout="NHD", **options)
    as_hnd = ar.paged_attention(q, ar.nhd_to_hnd(k8), ar.nhd_to_hnd(v8), table, lens, **options
                                | {"k_descale": ar.nhd_to_hnd(k_scale), "v_descale": ar.nhd_to_hnd(v_scale)})
    np.testing.assert_array_equal(as_hnd.astype(np.float32), out.astype(np.float32))
    wrong = out.copy()
    wrong[:, 3:6] = ar.paged_attention(q, k8, v8, table, lens, layout="NHD", **options | {"v_descale": v_scale * 1.1})[
        :, 3:6]
    with pytest.raises(AssertionError, match=r"^sequence 2: "):
        assert_paged_attention_close(wrong, q, k8, v8, table, lens, layout="NHD", **options)


@pytest.mark.parametrize("layout", ["hnd", "NHD ", None, 1])
def test_an_unknown_layout_is_a_value_error_naming_it(layout):
    k_pages, v_pages, table, lens = pools()
    q = np.zeros((4, 2, 1, 16), np.float16)
    with pytest.raises(ValueError, match=r"^layout must be one of 'HND', 'NHD'; got"):
        assert_paged_attention_close(q, q, k_pages, v_pages, table, lens, layout=layout)


def test_the_output_must_have_the_outputs_shape():
    k_pages, v_pages, table, lens = pools()
    q = np.zeros((4, 2, 1, 16), np.float16)
    with pytest.raises(ValueError, match=r"^actual must have the shape of the output, \(4, 2, 1, 16\)"):
        assert_paged_attention_close(q[:3], q, k_pages, v_pages, table, lens)


@pytest.mark.torch
def test_torch_tensors_go_in_as_they_are():
    torch = require("torch")
    k_pages, v_pages, table, lens = pools(4)
    q = np.random.default_rng(5).standard_normal((4, 2, 1, 16)).astype(np.float16)
    out = ar.paged_attention(q, k_pages, v_pages, table, lens)
    t = {name: torch.from_numpy(a) for name, a in
         {"out": out, "q": q, "k": k_pages, "v": v_pages, "table": table.astype(np.int32), "lens": lens}.items()}
    assert_paged_attention_close(t["out"], t["q"], t["k"], t["v"], t["table"], t["lens"])


def side_by_side_problem(seed=5):
    """Three sequences of four heads, 256 queries and 256, 200 and 256 keys in pages of 16 (each under
    `THREADED_SCORES` scores, together more: they run side by side on two threads)."""
    rng = np.random.default_rng(seed)
    k_pages, v_pages = (rng.standard_normal((48, 4, 16, 32)).astype(np.float16) for _ in range(2))
    table = rng.permutation(48).reshape(3, 16)
    lens = np.array([256, 200, 256])
    q = rng.standard_normal((3, 4, 256, 32)).astype(np.float16)
    return q, k_pages, v_pages, table, lens


def test_sequences_side_by_side_report_as_one_after_the_other(monkeypatch):
    """The same report, sequence by sequence in order, on two threads as on one (the sequences run side by
    side); a correct kernel passes."""
    q, k_pages, v_pages, table, lens = side_by_side_problem()
    options = {"is_causal": True, "causal_alignment": "bottom-right"}
    out = ar.paged_attention(q, k_pages, v_pages, table, lens, **options)
    assert_paged_attention_close(out, q, k_pages, v_pages, table, lens, **options)
    wrong = out.copy()
    wrong[0, 1, 7] += np.float16(0.05)
    wrong[2, 3] = ar.paged_attention(q, k_pages, v_pages, table, lens - 1, **options)[2, 3]
    reports = []
    for threads in ("1", "2"):
        monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", threads)
        with pytest.raises(AssertionError) as info:
            assert_paged_attention_close(wrong, q, k_pages, v_pages, table, lens, **options)
        reports.append(str(info.value))
    assert reports[0] == reports[1]
    assert reports[0].startswith("sequence 0: ") and "\nsequence 2: " in reports[0] and "sequence 1" not in reports[0]


def test_sequences_side_by_side_raise_the_first_sequence_s_error(monkeypatch):
    """An error in a sequence's check is raised as one after the other would: the first sequence's."""
    import attention_ref.testing._paged as paged

    def failing(actual, check, *, what, **kwargs):
        raise ValueError(f"{what}bad")

    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", "2")
    monkeypatch.setattr(paged, "output_failure", failing)
    q, k_pages, v_pages, table, lens = side_by_side_problem()
    with pytest.raises(ValueError, match=r"^sequence 0: bad$"):
        assert_paged_attention_close(q, q, k_pages, v_pages, table, lens)

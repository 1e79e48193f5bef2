"""attention_ref.testing.to_numpy (attention_ref/_interop.py): framework arrays in, exactly, in their own dtype."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import require

import attention_ref as ar
from attention_ref.testing import assert_attention_close, to_numpy


def test_an_ndarray_is_returned_as_it_is_and_a_list_becomes_one():
    x = np.arange(4, dtype=np.float16)
    assert to_numpy(x) is x
    got = to_numpy([[1, 2], [3, 4]])
    assert got.dtype == np.int64 and got.tolist() == [[1, 2], [3, 4]]


@pytest.mark.torch
@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16", "float32", "float64"])
def test_torch_tensors_keep_their_dtype_and_bits(name):
    torch = require("torch")
    ml_dtypes = require("ml_dtypes")
    values = torch.linspace(-3, 3, 25, dtype=torch.float64).to(getattr(torch, name))
    got = to_numpy(values)
    want_dtype = np.dtype(getattr(ml_dtypes, name)) if not hasattr(np, name) else np.dtype(name)
    assert got.dtype == want_dtype
    # the same numbers: both sides widened to float64 by their own framework
    np.testing.assert_array_equal(got.astype(np.float64), values.to(torch.float64).numpy())


#: Every fp8 format torch has, with values each holds exactly (float8_e8m0fnu: unsigned powers of two only).
_TORCH_FP8 = {
    "float8_e4m3fn": [-448.0, -3.0, -0.5, 0.0, 0.015625, 1.0, 1.125, 240.0, 448.0],
    "float8_e4m3fnuz": [-240.0, -3.0, -0.5, 0.0, 0.0078125, 1.0, 1.125, 240.0],
    "float8_e5m2": [-57344.0, -3.0, -0.5, 0.0, 2.0**-14, 1.0, 1.25, 57344.0],
    "float8_e5m2fnuz": [-57344.0, -3.0, -0.5, 0.0, 2.0**-15, 1.0, 1.25, 57344.0],
    "float8_e8m0fnu": [2.0**-20, 0.25, 1.0, 2.0, 2.0**40],
}


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(_TORCH_FP8))
def test_every_fp8_format_of_torch_converts_to_its_own_format_with_its_values(name):
    torch = require("torch")
    ml_dtypes = require("ml_dtypes")
    if not hasattr(torch, name):
        pytest.skip(f"this torch has no {name}")
    values = np.array(_TORCH_FP8[name])
    tensor = torch.tensor(values, dtype=torch.float64).to(getattr(torch, name))
    got = to_numpy(tensor)
    assert got.dtype == np.dtype(getattr(ml_dtypes, name))
    # every value is exact in its format, so the format read wrongly (e4m3fnuz's bits as e4m3fn's, whose exponent
    # bias differs by one) changes them; torch's own widening says what they are
    np.testing.assert_array_equal(tensor.to(torch.float64).numpy(), values)
    np.testing.assert_array_equal(got.astype(np.float64), values)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_a_numpy_float_tensor_that_requires_grad_converts_to_its_values(name):
    torch = require("torch")
    leaf = torch.linspace(-2, 2, 9, dtype=getattr(torch, name), requires_grad=True)
    for tensor in (leaf, leaf * 3):  # a leaf, and a result in the autograd graph
        got = to_numpy(tensor)
        assert got.dtype == np.dtype(name)
        np.testing.assert_array_equal(got, tensor.detach().numpy())
    np.testing.assert_array_equal(to_numpy(leaf * 3).astype(np.float64), np.linspace(-6, 6, 9))


@pytest.mark.torch
def test_the_checkers_take_torch_dtypes_for_dtype():
    torch = require("torch")
    require("ml_dtypes")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g, dtype=torch.bfloat16) for _ in range(3))
    wide = torch.nn.functional.scaled_dot_product_attention(q, k, v).float()
    assert_attention_close(wide, q, k, v, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="bfloat16"):
        assert_attention_close(wide * 1.02, q, k, v, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"^dtype must be float16, float32, float64 or bfloat16; got torch.int8$"):
        assert_attention_close(wide, q, k, v, dtype=torch.int8)


@pytest.mark.torch
def test_a_tensor_that_requires_grad_or_is_a_strided_view_converts():
    torch = require("torch")
    base = torch.randn(4, 6, dtype=torch.bfloat16, requires_grad=True)
    view = (base * 2)[:, 1::2].transpose(0, 1)  # a non-contiguous view in the autograd graph
    got = to_numpy(view)
    assert got.shape == (3, 4) and got.dtype.name == "bfloat16"
    np.testing.assert_array_equal(got.astype(np.float32), view.detach().float().numpy())


@pytest.mark.torch
def test_a_meta_tensor_is_a_value_error_naming_the_argument():
    torch = require("torch")
    meta = torch.empty(2, 3, 4, device="meta")
    q = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"^k is a torch tensor on device meta that cannot be copied"):
        assert_attention_close(q, q, meta, q)


@pytest.mark.torch
def test_the_checkers_take_bfloat16_torch_tensors_that_require_grad():
    torch = require("torch")
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 33, 16, generator=g, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_attention_close(out, q, k, v, is_causal=True)  # no .detach(), no .float(), no .numpy()
    with pytest.raises(AssertionError):
        assert_attention_close(out, q, k, v)


def test_an_object_with_only_dlpack_is_read_through_it():
    class OnlyDlpack:
        def __init__(self, arr):
            self._arr = arr

        def __dlpack__(self, **kwargs):
            return self._arr.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._arr.__dlpack_device__()

    x = np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)
    got = to_numpy(OnlyDlpack(x))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, x)


def test_an_object_with_array_is_read_through_it():
    class HasArray:
        def __array__(self, dtype=None, copy=None):
            return np.full((2, 2), 0.5, dtype=np.float16)

    got = to_numpy(HasArray())
    assert got.dtype == np.float16 and got.tolist() == [[0.5, 0.5], [0.5, 0.5]]


def test_a_cupy_like_array_is_copied_with_get():
    fake = type("ndarray", (), {"__module__": "cupy._core.core", "get": lambda self: np.ones(3, np.float16)})
    got = to_numpy(fake())
    assert got.dtype == np.float16 and got.tolist() == [1, 1, 1]


def test_something_that_is_no_array_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match=r"^q must hold real numbers; got dtype object"):
        assert_attention_close(np.zeros((2, 3)), object(), np.zeros((2, 3)), np.zeros((2, 3)))


def test_jax_arrays_keep_bfloat16():
    jnp = require("jax.numpy")
    x = jnp.linspace(-2, 2, 9, dtype=jnp.bfloat16)
    got = to_numpy(x)
    assert got.dtype.name == "bfloat16"
    np.testing.assert_array_equal(got.astype(np.float32), np.asarray(x.astype(jnp.float32)))


def test_the_package_imports_no_framework_of_its_own():
    code = (
        "import sys, numpy as np\n"
        "from attention_ref.testing import assert_attention_close, to_numpy\n"
        "q = np.ones((2, 4, 8), np.float16)\n"
        "import attention_ref as ar\n"
        "assert_attention_close(ar.scaled_dot_product_attention(q, q, q), to_numpy(q), q, q)\n"
        "print(sorted(m for m in ('torch', 'jax', 'cupy', 'ml_dtypes', 'matplotlib') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.torch
def test_the_whole_package_takes_framework_arrays_through_the_same_door():
    torch = require("torch")
    q = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    got = ar.scaled_dot_product_attention(q, q, q, mask=mask)
    want = ar.scaled_dot_product_attention(q.numpy(), q.numpy(), q.numpy(), mask=mask.numpy())
    np.testing.assert_array_equal(got, want)

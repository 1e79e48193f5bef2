"""Tests for plot_attention and plot_heads (headless, Agg backend)."""

import builtins
import io
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attention_ref import plot_attention, plot_heads
from attention_ref.plotting import text_colour


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _cell_texts(ax):
    """``{(row, col): text}`` of the annotations, keyed by the cell they sit in."""
    return {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}


# -- import cost ----------------------------------------------------------------


def test_importing_the_package_does_not_import_matplotlib():
    code = "import sys, attention_ref; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# -- matplotlib is optional (the plot extra) -----------------------------------

NEEDS_PLOT_EXTRA = "needs matplotlib, an optional dependency: pip install 'attention_ref[plot]'"
PLOT_CALLS = [
    pytest.param(plot_attention, (2, 2), id="plot_attention"),
    pytest.param(plot_heads, (2, 2, 2), id="plot_heads"),
]


@pytest.mark.parametrize(("function", "shape"), PLOT_CALLS)
def test_without_matplotlib_a_plotting_call_names_the_extra(monkeypatch, function, shape):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails as if it were absent
    with pytest.raises(ModuleNotFoundError) as info:
        function(np.full(shape, 0.5))
    assert str(info.value) == f"{function.__name__} {NEEDS_PLOT_EXTRA}"
    assert info.value.name == "matplotlib"
    assert isinstance(info.value, ImportError)


def test_without_matplotlib_the_package_and_its_checkers_still_work():
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import numpy as np, attention_ref\n"
        "from attention_ref.testing import assert_attention_close\n"
        "q = np.eye(2)[None]; out = attention_ref.scaled_dot_product_attention(q, q, q)\n"
        "assert_attention_close(out, q, q, q)\n"
        "try:\n"
        "    attention_ref.plot_attention(np.eye(2))\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"plot_attention {NEEDS_PLOT_EXTRA}"


def test_a_broken_matplotlib_install_keeps_its_own_error(monkeypatch):
    """Only matplotlib itself missing is reworded: a dependency of matplotlib missing is reported as it is."""
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "matplotlib":
            raise ModuleNotFoundError("No module named 'kiwisolver'", name="kiwisolver")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ModuleNotFoundError) as info:
        plot_attention(np.eye(2))
    assert str(info.value) == "No module named 'kiwisolver'"


# -- plot_attention: axes, labels, annotations ----------------------------------


def test_axis_titles_and_tick_labels():
    w = np.full((2, 3), 1 / 3)
    ax = plot_attention(w, ["q0", "q1"], ["k0", "k1", "k2"])
    assert ax.get_ylabel() == "query"
    assert ax.get_xlabel() == "key"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["q0", "q1"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["k0", "k1", "k2"]
    assert list(ax.get_yticks()) == [0, 1]
    assert list(ax.get_xticks()) == [0, 1, 2]


def test_rows_are_queries_and_columns_are_keys():
    # A 2x3 matrix must be drawn 2 cells tall and 3 wide, row 0 at the top.
    w = np.array([[0.0, 0.5, 1.0], [1.0, 0.5, 0.0]])
    ax = plot_attention(w)
    np.testing.assert_array_equal(ax.images[0].get_array(), w)
    bottom, top = ax.get_ylim()
    assert bottom > top  # imshow's origin="upper": query 0 is the top row


def test_annotations_show_each_value_in_its_cell():
    w = np.array([[0.125, 0.875], [0.5, 0.5]])
    ax = plot_attention(w, fmt=".3f")
    assert _cell_texts(ax) == {(0, 0): "0.125", (0, 1): "0.875", (1, 0): "0.500", (1, 1): "0.500"}


def test_default_format_is_two_decimals():
    ax = plot_attention(np.array([[0.256, 0.744]]))
    assert [t.get_text() for t in ax.texts] == ["0.26", "0.74"]


def test_annotation_is_automatic_for_small_matrices_only():
    assert len(plot_attention(np.full((12, 12), 1 / 12)).texts) == 144
    assert len(plot_attention(np.full((13, 4), 0.25)).texts) == 0
    assert len(plot_attention(np.full((13, 4), 0.25), annotate=True).texts) == 52
    assert len(plot_attention(np.full((2, 2), 0.5), annotate=False).texts) == 0


def test_non_finite_cells_are_left_blank():
    w = np.array([[np.nan, 1.0], [0.5, 0.5]])
    ax = plot_attention(w)
    assert set(_cell_texts(ax)) == {(0, 1), (1, 0), (1, 1)}


def test_text_colour_contrasts_with_the_cell():
    # viridis runs from dark purple (needs white text) to light yellow (needs black text).
    w = np.array([[0.0, 1.0]])
    ax = plot_attention(w)
    colours = {cell: t.get_color() for cell, t in zip(_cell_texts(ax), ax.texts, strict=True)}
    assert colours == {(0, 0): "white", (0, 1): "black"}
    # Reversing the colour map swaps them.
    ax = plot_attention(w, cmap="viridis_r")
    assert [t.get_color() for t in ax.texts] == ["black", "white"]


@pytest.mark.parametrize(
    ("background", "expected"),
    [((0, 0, 0, 1), "white"), ((1, 1, 1, 1), "black"), ((0, 0, 1, 1), "white"), ((1, 1, 0, 1), "black")],
)
def test_text_colour_by_wcag_contrast(background, expected):
    # Relative luminance: black 0, white 1, blue 0.0722, yellow 0.9278 (WCAG 2 coefficients).
    assert text_colour(background) == expected


def test_title_and_existing_axes():
    fig, ax = plt.subplots()
    out = plot_attention(np.eye(2), ax=ax, title="identity")
    assert out is ax
    assert ax.get_title() == "identity"
    assert plt.get_fignums() == [fig.number]


def test_colorbar_is_optional():
    ax = plot_attention(np.eye(2))
    assert len(ax.figure.axes) == 2
    ax = plot_attention(np.eye(2), colorbar=False)
    assert len(ax.figure.axes) == 1


# -- plot_attention: colour scale -----------------------------------------------


def test_default_colour_scale_is_zero_to_largest_weight():
    ax = plot_attention(np.array([[0.1, 0.6], [0.3, 0.2]]))
    assert ax.images[0].get_clim() == pytest.approx((0.0, 0.6))


def test_all_zero_weights_use_zero_to_one():
    # A fully masked matrix is all zeros; the scale must still be valid.
    ax = plot_attention(np.zeros((2, 2)))
    assert ax.images[0].get_clim() == (0.0, 1.0)


def test_explicit_colour_limits():
    ax = plot_attention(np.array([[0.1, 0.6]]), vmin=-1.0, vmax=2.0)
    assert ax.images[0].get_clim() == (-1.0, 2.0)


def test_largest_weight_ignores_nan():
    ax = plot_attention(np.array([[np.nan, 0.4], [0.25, 0.35]]))
    assert ax.images[0].get_clim() == pytest.approx((0.0, 0.4))


@given(arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 4)), elements=st.floats(0, 1, width=32)))
@settings(max_examples=15, deadline=None)
def test_annotations_match_values_property(w):
    ax = plot_attention(w, fmt=".4f", colorbar=False)
    texts = _cell_texts(ax)
    assert texts == {(i, j): f"{w[i, j]:.4f}" for i in range(w.shape[0]) for j in range(w.shape[1])}
    plt.close(ax.figure)


# -- plot_attention: errors -----------------------------------------------------


@pytest.mark.parametrize("shape", [(3,), (1, 2, 2), ()])
def test_weights_must_be_two_dimensional(shape):
    with pytest.raises(ValueError, match=r"weights must have exactly 2 dimensions"):
        plot_attention(np.zeros(shape))


def test_empty_weights_rejected():
    with pytest.raises(ValueError, match="weights must not be empty"):
        plot_attention(np.zeros((0, 3)))


def test_non_numeric_weights_rejected():
    with pytest.raises(TypeError, match="weights"):
        plot_attention(np.ones((2, 2), dtype=bool))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"query_labels": ["a"]}, "query_labels"), ({"key_labels": ["a", "b", "c", "d"]}, "key_labels")],
)
def test_label_length_must_match(kwargs, name):
    with pytest.raises(ValueError, match=rf"{name} must have one label per .* \(\d\); got \d"):
        plot_attention(np.full((2, 3), 1 / 3), **kwargs)


def test_labels_must_be_a_sequence_not_a_string():
    with pytest.raises(TypeError, match="query_labels"):
        plot_attention(np.eye(2), query_labels="ab")
    with pytest.raises(TypeError, match="key_labels"):
        plot_attention(np.eye(2), key_labels=3)


def test_bad_colour_limits_and_format():
    with pytest.raises(ValueError, match="vmax must be greater than vmin"):
        plot_attention(np.eye(2), vmin=1.0, vmax=1.0)
    with pytest.raises(ValueError, match="vmin must be finite"):
        plot_attention(np.eye(2), vmin=np.nan)
    with pytest.raises(TypeError, match="fmt"):
        plot_attention(np.eye(2), fmt=2)
    with pytest.raises(ValueError):
        plot_attention(np.eye(2), fmt=".2q")
    assert plt.get_fignums() == []  # nothing drawn before the checks


# -- plot_heads -----------------------------------------------------------------


def test_one_panel_per_head_with_default_titles():
    w = np.full((5, 2, 3), 1 / 3)
    fig = plot_heads(w, ncols=3)
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == [f"head {h}" for h in range(5)]
    assert sum(ax.get_visible() for ax in fig.axes[:6]) == 5  # 2x3 grid, one spare hidden
    assert len(fig.axes) == 7  # six grid cells and one colour bar


def test_heads_share_one_colour_scale():
    w = np.array([[[0.2, 0.1]], [[0.9, 0.0]]])
    fig = plot_heads(w)
    assert [ax.images[0].get_clim() for ax in fig.axes[:2]] == [pytest.approx((0.0, 0.9))] * 2
    fig = plot_heads(w, vmax=2.0, cmap="magma", annotate=False)
    assert [ax.images[0].get_clim() for ax in fig.axes[:2]] == [(0.0, 2.0)] * 2
    assert fig.axes[0].images[0].get_cmap().name == "magma"
    assert len(fig.axes[0].texts) == 0


def test_heads_labels_and_titles():
    w = np.full((2, 2, 2), 0.5)
    fig = plot_heads(w, ["a", "b"], ["c", "d"], titles=["first", "second"])
    first, second = fig.axes[:2]
    assert [first.get_title(), second.get_title()] == ["first", "second"]
    assert [t.get_text() for t in second.get_xticklabels()] == ["c", "d"]
    assert first.get_ylabel() == "query"
    assert second.get_ylabel() == ""  # only the first column names the query axis
    assert second.get_xlabel() == "key"


def test_ncols_is_capped_by_heads_and_figsize_passes_through():
    fig = plot_heads(np.full((2, 1, 1), 1.0), ncols=4, figsize=(5.0, 2.5))
    assert len(fig.axes) == 3  # a 1x2 grid and the colour bar
    assert tuple(fig.get_size_inches()) == (5.0, 2.5)


def test_plot_heads_errors():
    with pytest.raises(ValueError, match=r"weights must have exactly 3 dimensions"):
        plot_heads(np.eye(2))
    with pytest.raises(ValueError, match="weights must not be empty"):
        plot_heads(np.zeros((0, 2, 2)))
    with pytest.raises(ValueError, match="titles must have one label per head"):
        plot_heads(np.ones((2, 1, 1)), titles=["only one"])
    with pytest.raises(ValueError, match="ncols must be >= 1"):
        plot_heads(np.ones((2, 1, 1)), ncols=0)
    with pytest.raises(ValueError, match="key_labels"):
        plot_heads(np.ones((2, 1, 1)), key_labels=["a", "b"])
    for fixed in ("ax", "title", "colorbar"):
        with pytest.raises(TypeError, match=fixed):
            plot_heads(np.ones((2, 1, 1)), **{fixed: None})
    assert plt.get_fignums() == []


# -- colour-bar label -------------------------------------------------------------


def _colorbar_label(fig):
    """The label of the figure's one colour bar (the axes that holds no heatmap)."""
    (bar,) = [ax for ax in fig.axes if not ax.images and ax.get_visible() and ax.get_ylabel()]
    return bar.get_ylabel()


def test_colorbar_label_defaults_to_weight_and_can_be_changed():
    assert _colorbar_label(plot_attention(np.eye(2)).figure) == "weight"
    assert _colorbar_label(plot_attention(np.eye(2), label="bias").figure) == "bias"
    assert _colorbar_label(plot_heads(np.full((2, 2, 2), 0.5))) == "weight"
    bias = -np.arange(8.0).reshape(2, 2, 2)
    fig = plot_heads(bias, label="bias", vmin=-7.0, vmax=0.0)
    assert _colorbar_label(fig) == "bias"
    assert [ax.get_ylabel() for ax in fig.axes[:2]] == ["query", ""]  # panel labels are unchanged


def test_empty_label_draws_an_unlabelled_colour_bar():
    ax = plot_attention(np.eye(2), label="")
    assert len(ax.figure.axes) == 2
    assert ax.figure.axes[1].get_ylabel() == ""


# -- argument checks that used to reach matplotlib ---------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"ax": "ax"}, TypeError, r"^ax must be a matplotlib Axes"),
        ({"ax": np.zeros(2)}, TypeError, r"^ax "),
        ({"annotate": "yes"}, TypeError, r"^annotate must be True or False"),
        ({"annotate": 1}, TypeError, r"^annotate "),
        ({"colorbar": "yes"}, TypeError, r"^colorbar must be True or False"),
        ({"colorbar": None}, TypeError, r"^colorbar "),
        ({"label": 3}, TypeError, r"^label must be a string"),
        ({"label": None}, TypeError, r"^label "),
        ({"cmap": "no-such-map"}, ValueError, r"^cmap must be the name"),
        ({"cmap": 3}, TypeError, r"^cmap "),
    ],
)
def test_plot_attention_checks_arguments_before_drawing(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        plot_attention(np.eye(2), **kwargs)
    assert plt.get_fignums() == []


def test_bool_like_arguments_accept_numpy_bools_and_annotate_none():
    ax = plot_attention(np.eye(2), annotate=np.True_, colorbar=np.False_)
    assert len(ax.texts) == 4
    assert len(ax.figure.axes) == 1
    assert len(plot_attention(np.eye(2), annotate=None).texts) == 4  # small: annotated by default


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"figsize": (-1, 2)}, ValueError, r"^figsize must be a pair .* positive"),
        ({"figsize": (2, 0)}, ValueError, r"^figsize "),
        ({"figsize": (2, np.inf)}, ValueError, r"^figsize height must be finite"),
        ({"figsize": (2, 3, 4)}, ValueError, r"^figsize "),
        ({"figsize": 5}, TypeError, r"^figsize "),
        ({"figsize": ("2", 3)}, TypeError, r"^figsize width "),
        ({"annotate": "yes"}, TypeError, r"^annotate "),
        ({"label": 1.0}, TypeError, r"^label "),
        ({"cmap": "no-such-map"}, ValueError, r"^cmap "),
        ({"colour": "red"}, TypeError, r"unexpected keyword argument 'colour'"),
    ],
)
def test_plot_heads_checks_arguments_before_drawing(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        plot_heads(np.full((2, 2, 2), 0.5), **kwargs)
    assert plt.get_fignums() == []


def test_figsize_accepts_any_pair_of_positive_numbers():
    fig = plot_heads(np.full((1, 1, 1), 1.0), figsize=np.array([3, 2]))
    assert tuple(fig.get_size_inches()) == (3.0, 2.0)


# -- light and dark pages -----------------------------------------------------------

BOOK_RC = Path(__file__).resolve().parents[1] / "docs" / "chapters" / "matplotlibrc"


def _rendered_rgba(fig):
    """The figure as saved for the book: an (h, w, 4) float array."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=30)
    buffer.seek(0)
    return plt.imread(buffer)


@pytest.mark.parametrize(
    "draw",
    [lambda: plot_attention(np.eye(3)).figure, lambda: plot_heads(np.full((2, 2, 2), 0.5))],
    ids=["one", "heads"],
)
def test_figures_keep_the_styles_opaque_background(draw):
    """Under the book's style the saved image is fully opaque with white corners, readable on any page theme."""
    with matplotlib.rc_context(fname=str(BOOK_RC)):
        fig = draw()
        assert fig.get_facecolor() == (1.0, 1.0, 1.0, 1.0)
        assert all(ax.get_facecolor()[3] == 1.0 for ax in fig.axes)
        image = _rendered_rgba(fig)
    assert np.all(image[..., 3] == 1.0)  # no transparent pixel for a dark page to show through
    for corner in (image[0, 0], image[0, -1], image[-1, 0], image[-1, -1]):
        np.testing.assert_array_equal(corner, [1.0, 1.0, 1.0, 1.0])


def test_figures_follow_the_rc_background_rather_than_forcing_one():
    with matplotlib.rc_context({"figure.facecolor": "0.5", "axes.facecolor": "0.25"}):
        ax = plot_attention(np.eye(2))
    assert ax.figure.get_facecolor() == pytest.approx((0.5, 0.5, 0.5, 1.0))
    assert ax.get_facecolor() == pytest.approx((0.25, 0.25, 0.25, 1.0))


def _diagram():
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(3, 2))
    box = ax.add_patch(Rectangle((0.1, 0.3), 0.8, 0.4))
    label = ax.text(0.5, 0.5, "softmax", ha="center", va="center")
    return fig, ax, box, label


def test_check_labels_passes_a_clean_diagram_and_names_each_fault():
    from attention_ref import check_labels

    fig, ax, box, label = _diagram()
    check_labels(fig, [(box, label)])
    label.set_text("a label far wider than its box")
    with pytest.raises(AssertionError, match="'a label far wider than its box' leaves its box"):
        check_labels(fig, [(box, label)])
    label.set_text("softmax")
    clash = ax.text(0.5, 0.5, "scores", ha="center", va="center")
    with pytest.raises(AssertionError, match="labels 'softmax' and 'scores' overlap"):
        check_labels(fig, [(box, label), (box, clash)])
    clash.remove()
    ax.text(0.5, 0.9, "outside", ha="center", va="center")  # wholly outside the box: fine
    check_labels(fig, [(box, label)])
    ax.text(0.5, 0.7, "on the edge", ha="center", va="center")  # not paired: may not cross an edge
    with pytest.raises(AssertionError, match="'on the edge' crosses the edge of a Rectangle"):
        check_labels(fig, [(box, label)])


def test_check_labels_lets_a_box_around_boxes_hold_their_labels():
    from matplotlib.patches import Rectangle

    from attention_ref import check_labels

    fig, ax, box, label = _diagram()
    group = ax.add_patch(Rectangle((0.02, 0.1), 0.96, 0.85, fill=False))
    title = ax.text(0.5, 0.85, "a block", ha="center", va="center")
    check_labels(fig, [(box, label), (group, title)])


def test_check_labels_takes_a_figure_only():
    from attention_ref import check_labels

    _fig, ax, _, _ = _diagram()
    with pytest.raises(TypeError, match="fig must be a matplotlib Figure; got Axes"):
        check_labels(ax)

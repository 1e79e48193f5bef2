"""Heatmaps of attention weights.

matplotlib is an optional dependency, installed by the ``plot`` extra (``pip install 'attention_ref[plot]'``). It is
imported on a plotting call, never when the package is, so everything else works without it.
"""

from __future__ import annotations

import math

import numpy as np

from ._validation import as_real_array, check_bool, check_exact_ndim, check_int, check_real

__all__ = ["check_labels", "plot_attention", "plot_heads"]

#: Matrices up to this many rows and columns get their values written in the cells.
ANNOTATE_MAX = 12

#: What a plotting call without matplotlib says, after the function's name.
_MISSING = "needs matplotlib, an optional dependency: pip install 'attention_ref[plot]'"


def _require_matplotlib(function: str) -> None:
    """Import matplotlib, or raise a ModuleNotFoundError naming `function` and the extra that installs it.

    Only matplotlib itself missing is reworded; an installed matplotlib that fails to import (a missing dependency
    of its own, say) raises its own error unchanged.
    """
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "matplotlib":
            raise
        raise ModuleNotFoundError(f"{function} {_MISSING}", name="matplotlib") from exc


def _labels(labels, name: str, size: int, what: str) -> list[str] | None:
    """Return `labels` as a list of strings, checking there is one per `what`."""
    if labels is None:
        return None
    if isinstance(labels, str):
        raise TypeError(f"{name} must be a sequence of labels, not a single string; got {labels!r}")
    try:
        labels = [str(label) for label in labels]
    except TypeError:
        raise TypeError(f"{name} must be a sequence of labels; got {type(labels).__name__}") from None
    if len(labels) != size:
        raise ValueError(f"{name} must have one label per {what} ({size}); got {len(labels)}")
    return labels


def _check_fmt(fmt) -> None:
    """Reject a bad format specification before anything is drawn."""
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format specification string such as '.2f'; got {fmt!r}")
    try:
        format(0.5, fmt)
    except ValueError as exc:
        raise ValueError(f"fmt must be a format specification for a float such as '.2f'; got {fmt!r}: {exc}") from None


def _check_label(label) -> str:
    """Return the colour-bar label, which must be a string (``""`` for none)."""
    if not isinstance(label, str):
        raise TypeError(f"label must be a string (the colour-bar label); got {label!r} of type {type(label).__name__}")
    return label


def _check_annotate(annotate) -> bool | None:
    """`annotate` is None (decide by size), True or False."""
    return None if annotate is None else check_bool(annotate, "annotate")


def _check_ax(ax):
    """Return `ax` unchanged if it is None or a matplotlib Axes; anything else is a TypeError."""
    if ax is not None:
        from matplotlib.axes import Axes

        if not isinstance(ax, Axes):
            raise TypeError(f"ax must be a matplotlib Axes (or None for a new figure); got {type(ax).__name__}")
    return ax


def _check_figsize(figsize) -> tuple[float, float] | None:
    """Return `figsize` as ``(width, height)``: None, or two positive finite numbers of inches."""
    if figsize is None:
        return None
    expected = "a pair (width, height) of positive finite numbers of inches"
    try:
        width, height = figsize
    except TypeError:
        raise TypeError(f"figsize must be {expected}; got {figsize!r}") from None
    except ValueError:
        raise ValueError(f"figsize must be {expected}; got {figsize!r}") from None
    width, height = check_real(width, "figsize width"), check_real(height, "figsize height")
    if not (width > 0 and height > 0):
        raise ValueError(f"figsize must be {expected}; got {figsize!r}")
    return width, height


def resolved_colormap(cmap):
    """Return `cmap` (a name, a Colormap, or None for the rc default) as a Colormap, or raise naming `cmap`."""
    import matplotlib

    try:
        return matplotlib.colormaps.get_cmap(cmap)
    except (TypeError, ValueError):
        kind = TypeError if not isinstance(cmap, str) else ValueError
        raise kind(f"cmap must be the name of a matplotlib colour map or a Colormap; got {cmap!r}") from None


def _colour_limits(weights: np.ndarray, vmin, vmax) -> tuple[float, float]:
    """Return ``(vmin, vmax)``; `vmax` defaults to the largest finite weight, or 1 if that is not above `vmin`."""
    vmin = check_real(vmin, "vmin")
    if vmax is None:
        finite = weights[np.isfinite(weights)]
        top = float(finite.max()) if finite.size else -math.inf
        vmax = top if top > vmin else vmin + 1.0
    vmax = check_real(vmax, "vmax")
    if not vmax > vmin:
        raise ValueError(f"vmax must be greater than vmin; got vmin={vmin}, vmax={vmax}")
    return vmin, vmax


def _relative_luminance(rgba) -> float:
    """WCAG 2 relative luminance of an sRGB colour with components in [0, 1]."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def text_colour(background) -> str:
    """``"black"`` or ``"white"``, whichever has the higher WCAG contrast ratio on `background`."""
    luminance = _relative_luminance(background)
    contrast_black = (luminance + 0.05) / 0.05
    contrast_white = 1.05 / (luminance + 0.05)
    return "black" if contrast_black >= contrast_white else "white"


def _set_ticks(axis_ticks, axis_labels, labels, size: int, *, rotate: bool = False) -> None:
    """Label every cell when labels are given (or the axis is short); else keep matplotlib's integer ticks."""
    if labels is None and size > 2 * ANNOTATE_MAX:
        return
    axis_ticks(np.arange(size))
    if labels is not None:
        if rotate and max((len(label) for label in labels), default=0) > 2:
            axis_labels(labels, rotation=45, ha="right", rotation_mode="anchor")
        else:
            axis_labels(labels)


def plot_attention(
    weights,
    query_labels=None,
    key_labels=None,
    *,
    ax=None,
    annotate=None,
    fmt=".2f",
    cmap="viridis",
    vmin=0.0,
    vmax=None,
    title=None,
    colorbar=True,
    label="weight",
):
    r"""Draw an attention-weight matrix as a heatmap: queries down, keys across.

    Parameters
    ----------
    weights : array_like, shape (L, S)
        Attention weights, one row per query and one column per key (for
        example the second result of ``scaled_dot_product_attention(...,
        return_weights=True)`` for one batch entry and head).
    query_labels : sequence of str, optional
        One label per query (row), e.g. the query tokens. Default: indices.
    key_labels : sequence of str, optional
        One label per key (column). Default: indices.
    ax : matplotlib.axes.Axes, optional
        Axes to draw into. Default: a new figure from ``pyplot.subplots``.
    annotate : bool or None, optional
        Write each value in its cell. Default (None): only when the matrix
        has at most 12 rows and 12 columns.
    fmt : str, optional
        Format specification for the cell values (as in :func:`format`).
    cmap : str or Colormap, optional
        Colour map (a name registered with matplotlib, or a Colormap).
    vmin : float, optional
        Value drawn with the lowest colour. Default 0.
    vmax : float, optional
        Value drawn with the highest colour. Default: the largest finite
        weight, or ``vmin + 1`` if no weight exceeds `vmin` (e.g. all zeros).
    title : str, optional
        Axes title.
    colorbar : bool, optional
        Add a colour bar next to the axes.
    label : str, optional
        Colour-bar label, e.g. ``"bias"`` or ``"score"`` when the matrix is
        not a matrix of weights; ``""`` for none.

    Returns
    -------
    matplotlib.axes.Axes
        The axes holding the heatmap (``ax.images[0]``), y axis labelled
        ``"query"`` and x axis ``"key"``.

    Raises
    ------
    ModuleNotFoundError
        If matplotlib is not installed (the ``plot`` extra installs it).
    TypeError
        If `weights` is not real-valued, a label argument is not a sequence,
        `ax` is not a matplotlib Axes, `annotate` or `colorbar` is not a
        bool, `label` or `fmt` is not a string, or `cmap` is not a name or
        Colormap.
    ValueError
        If `weights` is not 2-D or is empty, a label sequence has the wrong
        length, ``vmax <= vmin``, or `fmt` or `cmap` is unknown.

    See Also
    --------
    plot_heads : One heatmap per head on a shared colour scale.
    scaled_dot_product_attention : Returns the weights with ``return_weights=True``.

    Notes
    -----
    Cell text is black or white, whichever contrasts more with the cell's
    colour by the WCAG 2 contrast ratio
    :math:`(L_1 + 0.05) / (L_2 + 0.05)`, with :math:`L` the relative
    luminance of the sRGB colour. Non-finite weights are left blank.
    Every argument is checked before anything is drawn, so an error leaves
    no empty figure behind. Colours of the figure background, axes and
    text come from matplotlib's rc settings and are never set here (in
    particular the background is never made transparent), so a style with
    an opaque white figure reads the same on light and dark pages.
    matplotlib, an optional dependency (``pip install
    'attention_ref[plot]'``), is imported on the first call, not when the
    package is.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import plot_attention
    >>> w = np.array([[1.0, 0.0], [0.25, 0.75]])
    >>> ax = plot_attention(w, ["a", "b"], ["x", "y"], title="two tokens")
    >>> ax.get_ylabel(), ax.get_xlabel()
    ('query', 'key')
    >>> [t.get_text() for t in ax.get_yticklabels()]
    ['a', 'b']
    >>> [t.get_text() for t in ax.texts]
    ['1.00', '0.00', '0.25', '0.75']
    >>> ax.images[0].get_clim()
    (0.0, 1.0)
    >>> import matplotlib.pyplot as plt
    >>> plt.close(ax.figure)
    """
    _require_matplotlib("plot_attention")
    w = as_real_array(weights, "weights")
    check_exact_ndim(w, "weights", 2, "(L, S)")
    n_queries, n_keys = w.shape
    if w.size == 0:
        raise ValueError(f"weights must not be empty; got shape {w.shape}")
    query_labels = _labels(query_labels, "query_labels", n_queries, "query (row of weights)")
    key_labels = _labels(key_labels, "key_labels", n_keys, "key (column of weights)")
    vmin, vmax = _colour_limits(w, vmin, vmax)
    annotate = _check_annotate(annotate)
    if annotate is None:
        annotate = n_queries <= ANNOTATE_MAX and n_keys <= ANNOTATE_MAX
    _check_fmt(fmt)
    colorbar = check_bool(colorbar, "colorbar")
    label = _check_label(label)
    cmap = resolved_colormap(cmap)
    ax = _check_ax(ax)

    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots()
    ratio = max(n_queries, n_keys) / min(n_queries, n_keys)
    image = ax.imshow(
        w.astype(np.float64), cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest",
        aspect="equal" if ratio <= 4 else "auto",
    )
    ax.set_ylabel("query")
    ax.set_xlabel("key")
    _set_ticks(ax.set_yticks, ax.set_yticklabels, query_labels, n_queries)
    _set_ticks(ax.set_xticks, ax.set_xticklabels, key_labels, n_keys, rotate=True)
    if title is not None:
        ax.set_title(title)

    if annotate:
        fontsize = "small" if max(n_queries, n_keys) <= 6 else "x-small"
        colours = image.to_rgba(w.astype(np.float64))  # (L, S, 4): the colour each cell is drawn with
        for i in range(n_queries):
            for j in range(n_keys):
                if np.isfinite(w[i, j]):
                    ax.text(
                        j, i, format(float(w[i, j]), fmt), ha="center", va="center",
                        color=text_colour(colours[i, j]), fontsize=fontsize,
                    )
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=label)
    return ax


#: Keywords plot_heads passes on to plot_attention (the others it sets itself, per panel).
_PANEL_KEYWORDS = ("annotate", "fmt", "cmap", "vmin", "vmax")


def plot_heads(
    weights, query_labels=None, key_labels=None, *, ncols=4, titles=None, figsize=None, label="weight", **kwargs
):
    r"""Draw one attention heatmap per head, all on one colour scale.

    Parameters
    ----------
    weights : array_like, shape (H, L, S)
        Attention weights of H heads (e.g. one batch entry of the weights
        returned by ``multi_head_attention(..., return_weights=True)``).
    query_labels : sequence of str, optional
        One label per query (row), shared by every head.
    key_labels : sequence of str, optional
        One label per key (column), shared by every head.
    ncols : int, optional
        Heads per row of the grid (fewer if there are fewer heads).
    titles : sequence of str, optional
        One title per head. Default ``"head 0"``, ``"head 1"``, ...
    figsize : tuple of float, optional
        Figure size ``(width, height)`` in inches, both positive. Default:
        about 2.8 inches per panel.
    label : str, optional
        Label of the shared colour bar, e.g. ``"bias"`` when the panels show
        additive biases rather than weights; ``""`` for none.
    **kwargs
        Passed on to :func:`plot_attention`: `annotate`, `fmt`, `cmap`,
        `vmin`, `vmax`. The default `vmax` is the largest weight over *all*
        heads, so colours compare across panels.

    Returns
    -------
    matplotlib.figure.Figure
        A figure (constrained layout) with one axes per head, in head order,
        unused grid cells hidden, and a single colour bar.

    Raises
    ------
    ModuleNotFoundError
        If matplotlib is not installed (the ``plot`` extra installs it).
    TypeError
        If `weights` is not real-valued, a keyword is not accepted (`ax`,
        `title` and `colorbar` are set here), a label argument is not a
        sequence, `figsize` is not a pair, or a passed-on keyword has the
        wrong type (as in `plot_attention`).
    ValueError
        If `weights` is not 3-D or is empty, `ncols` < 1, `titles` or a
        label sequence has the wrong length, `figsize` is not two positive
        finite numbers, or a passed-on keyword has a bad value.

    See Also
    --------
    plot_attention : A single heatmap.
    multi_head_attention : Returns per-head weights with ``return_weights=True``.

    Notes
    -----
    Panel :math:`h` is ``plot_attention(weights[h], ...)`` without its own
    colour bar: queries down, keys across, cell values written when the
    matrices are small. The panels fill a grid of
    :math:`\lceil H / \text{ncols} \rceil` rows in head order; only the
    first column names the query axis and only the lowest panel of each
    column names the key axis. All panels share one colour scale,
    :math:`[\text{vmin}, \text{vmax}]` with `vmax` defaulting to the
    largest finite value over *all* heads, so one colour means the same
    weight in every panel and a single colour bar serves the figure. As in
    `plot_attention`, every argument is checked before the figure is made
    and the figure's background colours come from matplotlib's rc settings;
    matplotlib (the ``plot`` extra) is imported on the first call.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import plot_heads
    >>> w = np.array([[[1.0, 0.0], [0.5, 0.5]],
    ...               [[0.2, 0.8], [0.0, 1.0]],
    ...               [[0.6, 0.4], [0.3, 0.7]]])
    >>> fig = plot_heads(w, ["a", "b"], ["a", "b"], ncols=2)
    >>> [ax.get_title() for ax in fig.axes[:3]]
    ['head 0', 'head 1', 'head 2']
    >>> fig.axes[3].get_visible()  # the unused fourth cell of the 2x2 grid
    False
    >>> {ax.images[0].get_clim() for ax in fig.axes[:3]}
    {(0.0, 1.0)}
    >>> import matplotlib.pyplot as plt
    >>> plt.close(fig)
    """
    _require_matplotlib("plot_heads")
    w = as_real_array(weights, "weights")
    check_exact_ndim(w, "weights", 3, "(H, L, S)")
    if w.size == 0:
        raise ValueError(f"weights must not be empty; got shape {w.shape}")
    n_heads = w.shape[0]
    ncols = min(check_int(ncols, "ncols", minimum=1), n_heads)
    nrows = math.ceil(n_heads / ncols)
    titles = [f"head {h}" for h in range(n_heads)] if titles is None else _labels(titles, "titles", n_heads, "head")
    for fixed in ("ax", "title", "colorbar"):
        if fixed in kwargs:
            raise TypeError(f"plot_heads sets {fixed!r} itself; got an unexpected keyword argument {fixed!r}")
    unknown = sorted(kwargs.keys() - set(_PANEL_KEYWORDS))
    if unknown:
        raise TypeError(
            f"plot_heads got an unexpected keyword argument {unknown[0]!r}; it passes on only "
            f"{', '.join(_PANEL_KEYWORDS)} to plot_attention"
        )
    # Check everything before a figure exists, so an error leaves no empty figure behind.
    _labels(query_labels, "query_labels", w.shape[1], "query (row of weights)")
    _labels(key_labels, "key_labels", w.shape[2], "key (column of weights)")
    _check_fmt(kwargs.get("fmt", ".2f"))
    _check_annotate(kwargs.get("annotate"))
    if "cmap" in kwargs:
        kwargs["cmap"] = resolved_colormap(kwargs["cmap"])
    label = _check_label(label)
    figsize = _check_figsize(figsize)
    # One colour scale for every panel.
    kwargs["vmin"], kwargs["vmax"] = _colour_limits(w, kwargs.get("vmin", 0.0), kwargs.get("vmax"))

    import matplotlib.pyplot as plt

    if figsize is None:
        figsize = (2.8 * ncols + 0.8, 2.8 * nrows)
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=False, layout="constrained")
    axes = axes.ravel()
    for h in range(n_heads):
        plot_attention(
            w[h], query_labels, key_labels, ax=axes[h], title=titles[h], colorbar=False, **kwargs
        )
        if h % ncols:  # the query axis label only on the first column
            axes[h].set_ylabel("")
        if h < n_heads - ncols:  # the key axis label only on the lowest panel of each column
            axes[h].set_xlabel("")
    for spare in axes[n_heads:]:
        spare.set_visible(False)
    fig.colorbar(axes[0].images[0], ax=list(axes[:n_heads]), shrink=0.8, label=label)
    return fig


def check_labels(fig, boxes=()) -> None:
    """Assert that a drawn diagram's text is legible: each label inside its box, no two things overlapping.

    Draws `fig` and compares the extents, in pixels, of every text placed on
    it or on its axes (``fig.text``, ``ax.text``, annotations; titles, tick
    labels and legends aside) and every patch (boxes, circles, arrows):

    * a label paired with a box in `boxes` lies wholly inside that box;
    * no label crosses the edge of any patch: it lies wholly inside or
      wholly outside each (a box drawn around other boxes may hold their
      labels);
    * no label overlaps another label.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The diagram, drawn with ``ax.text`` labels and patches.
    boxes : iterable of (patch, text) pairs, optional
        Each box with the label that belongs inside it.

    Returns
    -------
    None

    Raises
    ------
    AssertionError
        Naming the label that leaves its box or crosses an edge, or the two
        labels that overlap.
    TypeError
        If `fig` is not a matplotlib figure, or `boxes` does not hold
        (patch, text) pairs.

    See Also
    --------
    plot_attention : heatmaps, whose cell values need no such check.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("agg")
    >>> import matplotlib.pyplot as plt
    >>> from matplotlib.patches import Rectangle
    >>> from attention_ref.plotting import check_labels
    >>> fig, ax = plt.subplots(figsize=(3, 2))
    >>> box = ax.add_patch(Rectangle((0.1, 0.3), 0.8, 0.4))
    >>> label = ax.text(0.5, 0.5, "softmax", ha="center", va="center")
    >>> check_labels(fig, [(box, label)])
    >>> clash = ax.text(0.5, 0.5, "scores", ha="center", va="center")
    >>> check_labels(fig, [(box, label)])
    Traceback (most recent call last):
    ...
    AssertionError: the labels 'softmax' and 'scores' overlap
    >>> plt.close(fig)
    """
    _require_matplotlib("check_labels")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.text import Text

    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure; got {type(fig).__name__}")
    try:
        pairs = [tuple(pair) for pair in boxes]
    except TypeError:
        raise TypeError(f"boxes must be an iterable of (patch, text) pairs; got {type(boxes).__name__}") from None
    for n, pair in enumerate(pairs):
        if len(pair) != 2 or not isinstance(pair[0], Patch) or not isinstance(pair[1], Text):
            raise TypeError(f"boxes must be an iterable of (patch, text) pairs; entry {n} is "
                            f"({', '.join(type(x).__name__ for x in pair)})")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # every raster canvas has one
    owner = {id(label): patch for patch, label in pairs}
    texts = [t for t in [*fig.texts, *(t for ax in fig.axes for t in ax.texts)]
             if t.get_visible() and t.get_text().strip()]
    patches = [p for p in [*fig.patches, *(p for ax in fig.axes for p in ax.patches)] if p.get_visible()]
    for n, text in enumerate(texts):
        inner = text.get_window_extent(renderer)
        for patch in patches:
            outer = patch.get_window_extent(renderer)
            inside = outer.x0 <= inner.x0 and inner.x1 <= outer.x1 and outer.y0 <= inner.y0 and inner.y1 <= outer.y1
            if owner.get(id(text)) is patch and not inside:
                raise AssertionError(f"the label {text.get_text()!r} leaves its box")
            if inner.overlaps(outer) and not inside:
                raise AssertionError(f"the label {text.get_text()!r} crosses the edge of a {type(patch).__name__}")
        for other in texts[n + 1 :]:
            if inner.overlaps(other.get_window_extent(renderer)):
                raise AssertionError(f"the labels {text.get_text()!r} and {other.get_text()!r} overlap")

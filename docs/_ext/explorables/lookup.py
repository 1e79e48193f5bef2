"""Chapter 1's explorable figure (Queries, keys and values): the soft lookup term by term, each weight times
value added up to the output of attention."""

from __future__ import annotations

import itertools

import numpy as np

from . import widgets

_SUB_J = "<sub><i>j</i></sub>"  # the key index, typeset


def _vector(x) -> str:
    """A short vector to two decimals, kept on one line (a no-break space after each comma); no "-0.00"."""
    return "(" + ",\u00a0".join(f"{c:.2f}".replace("-0.00", "0.00") for c in x) + ")"


def lookup_state(q, k, v, temperature):
    """One setting of the lookup explorable, from the package: scores ``s_j = q . k_j`` (shown unscaled), the
    weights (softmax of ``s_j / T``), each term ``alpha_j v_j``, their running sum and the output."""
    import attention_ref as ar

    out, weights = ar.scaled_dot_product_attention(q[None, :], k, v, scale=1 / temperature, return_weights=True)
    weights, out = weights[0], out[0]  # (S,), (Ev,)
    terms = weights[:, None] * v  # (S, Ev)
    return k @ q, weights, terms, np.cumsum(terms, axis=0), out


def lookup_terms(keys, values, key_labels, queries, query_labels, temperatures=(1.0, 0.3, 0.1)):
    """The lookup explorable: the reader picks a query (and a temperature) and sees each weight x value term
    ``alpha_j v_j`` and their running sum, which ends at the output of attention.

    `keys` (S, E), `values` (S, Ev), `queries` (n, E): n query settings named by `query_labels`. Every number is
    computed by `attention_ref.scaled_dot_product_attention` here; the inputs are carried in the page
    (``inputs``) so a test can recompute what each setting shows.
    """
    k, v, qs = (np.asarray(x, dtype=np.float64) for x in (keys, values, queries))
    books, names = list(map(str, key_labels)), list(map(str, query_labels))
    temperatures = [float(t) for t in temperatures]
    states = {}
    for (a, q), (b, temperature) in itertools.product(enumerate(qs), enumerate(temperatures)):
        scores, weights, terms, running, out = lookup_state(q, k, v, temperature)
        top = int(np.argmax(weights))
        distance = float(np.linalg.norm(out - v[top]))
        plain = widgets.PLAIN
        grid = [[[f"{scores[j]:.2f}", plain], widgets.weight_cell(weights[j]), [_vector(v[j]), plain],
                 [_vector(terms[j]), plain], [_vector(running[j]), plain]] for j in range(len(books))]
        states[widgets.key(a, b)] = {
            "text": {"output": _vector(out)},
            "grids": {"terms": grid},
            "status": f"{names[a]}, temperature {temperature:g}: {books[top]} takes {weights[top]:.2f} of the "
                      f"weight, and the output {_vector(out)} lies {distance:.2f} from its value "
                      f"{_vector(v[top])}.",
        }
    columns = [f"score <i>s</i>{_SUB_J}", f"weight <i>\u03b1</i>{_SUB_J}", f"value <i>v</i>{_SUB_J}",
               f"term <i>\u03b1</i>{_SUB_J}<i>v</i>{_SUB_J}", "running sum"]
    table = widgets.html_table("terms", "Each book's share of the output, top to bottom", columns, books, "book")
    summary = ('<p class="ex-summary">Output = \u03a3 <i>\u03b1</i><sub><i>j</i></sub> <i>v</i><sub><i>j</i>'
               '</sub> = <span data-slot="output"></span>: the last running sum.</p>')
    controls = [widgets.select("query", "Query", [(str(a), n) for a, n in enumerate(names)], "0"),
                widgets.select("temperature", "Temperature",
                               [(str(b), f"{t:g}") for b, t in enumerate(temperatures)], "0")]
    inputs = {"keys": k.tolist(), "values": v.tolist(), "queries": qs.tolist(), "temperatures": temperatures}
    page = widgets.page(
        "lookup", "The soft lookup term by term: weight \u00d7 value, added up", controls, table + summary,
        states, ["query", "temperature"], widgets.key(0, 0), inputs=inputs,
        intro="Choose a query and a temperature: each book's value, times its weight, adds one term to the "
              "running sum, and the last sum is the output.",
    )
    # The still image (notebooks, PDF, EPUB): the default setting drawn in the plane of the values.
    scores, weights, terms, running, out = lookup_state(qs[0], k, v, temperatures[0])
    fig, (plane, bars) = widgets.figure(2, 8)
    colours = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"]
    start, labels = np.zeros(v.shape[1]), []
    for j, book in enumerate(books):
        colour = colours[j % len(colours)]
        plane.plot(*v[j, :2], "o", color=colour)
        above = v[j, 1] > 0  # labels away from the origin, where the arrows run
        labels.append(plane.annotate(book, v[j, :2], xytext=(0, 6 if above else -6), textcoords="offset points",
                                     ha="center", va="bottom" if above else "top", fontsize=7, color="#222222"))
        plane.annotate("", xy=running[j, :2], xytext=start[:2],
                       arrowprops=dict(arrowstyle="-|>", color=colour, lw=2))
        start = running[j]
    plane.plot(*out[:2], "*", color="#222222", markersize=12)
    plane.margins(0.25)
    plane.set_aspect("equal", adjustable="datalim")
    plane.set_title("the terms head to tail; \u2605 the output", fontsize=9)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [label.get_window_extent(renderer) for label in labels]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2)), "value labels overlap"
    bars.barh(books[::-1], weights[::-1], color="#0072B2")
    bars.set_xlim(0, 1)
    bars.set_xlabel("weight")
    bars.set_title(f"weights at temperature {temperatures[0]:g}", fontsize=9)
    alt = (f"Left: the values of the {len(books)} books as labelled coloured dots in the plane, and the terms "
           f"weight times value drawn head to tail from the origin, one arrow per book in its colour, ending on a "
           f"star "
           f"at the output {_vector(out)} for the query {names[0]}. Right: the {len(books)} weights as bars, "
           f"the largest {weights.max():.2f} on {books[int(np.argmax(weights))]}.")
    return widgets.Explorable("lookup", page, widgets.png_of(fig), alt)

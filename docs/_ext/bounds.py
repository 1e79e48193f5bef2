"""Glued numbers stated as bounds, rounded outward: the roles ``{glue:up}`` and ``{glue:down}``.

Corrects: MyST-NB's ``{glue:text}`name:.2f``` formats the glued value with Python's ``format``, which rounds to
nearest. A measured maximum of 0.1336 then prints as "0.13", and "no weight exceeds 0.13" is false. Here
``{glue:up}`name:.2f``` rounds the value up (towards +inf) to the format's last shown digit, for an upper
bound ("at most", "below", "or better"), and ``{glue:down}`name:.2f``` rounds it down (towards -inf), for a
lower bound ("at least", "above"). The format spec is the one ``glue:text`` takes, for the types ``f``,
``F``, ``e``, ``E``, ``g``, ``G`` and ``%`` (grouping such as ``,`` is kept); an integer or a value that the
format shows exactly is printed unchanged. The glued value must be a number (glue the raw float, not a
formatted string); anything else is a build warning, which the strict build turns into an error.
``tests/test_bounds.py`` checks every bound in the built book, whichever role prints it.

The rounding is done in `decimal` on the float's repr (the shortest decimal that reads back as it), so the
shown number is never on the wrong side by a floating-point slip, and a value such as 1e-05 prints as itself.
Public API only (``Sphinx.add_role_to_domain`` on MyST-NB's ``glue`` domain, whose ``glue:text`` role this
mirrors). Verified with Sphinx 9.0.4 and MyST-NB 1.4.0.
"""

from __future__ import annotations

import re
from ast import literal_eval
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from docutils import nodes

_SPEC = re.compile(r"^(?P<head>.*?)(?:\.(?P<precision>\d+))?(?P<type>[eEfFgG%])$")
UP, DOWN = "up", "down"


def format_outward(value, spec: str, direction: str) -> str:
    """``format(value, spec)``, with the last shown digit rounded up (`UP`) or down (`DOWN`), never to nearest.

    Up is towards +inf and down towards -inf, whatever the sign: an upper bound on a negative value moves
    towards zero, a lower bound away from it. A bound that rounds to zero prints as ``0``, never ``-0``.

    >>> format_outward(0.1336, ".2f", "up"), format_outward(0.1336, ".2f", "down")
    ('0.14', '0.13')
    >>> format_outward(-0.1336, ".2f", "up"), format_outward(-0.1336, ".2f", "down")
    ('-0.13', '-0.14')
    >>> format_outward(3.3e-16, ".0e", "up"), format_outward(-3.3e-16, ".0e", "up")
    ('4e-16', '-3e-16')
    >>> format_outward(-1234.5, ".3g", "up"), format_outward(-1234.5, ".3g", "down")
    ('-1.23e+03', '-1.24e+03')
    >>> format_outward(-0.004, ".2f", "up"), format_outward(-0.004, ".2f", "down")
    ('0.00', '-0.01')

    Percents round the same way, in the shown percent's last digit (to nearest, 0.0131 would show 1.3% and
    0.0136 would show 1.4%):

    >>> format_outward(0.0131, ".1%", "up"), format_outward(0.0136, ".1%", "down")
    ('1.4%', '1.3%')
    >>> format_outward(-0.0131, ".1%", "up"), format_outward(-0.0131, ".1%", "down")
    ('-1.3%', '-1.4%')
    >>> format_outward(0.25, ".0%", "up"), format_outward(-0.00001, ".0%", "up")
    ('25%', '0%')

    A value the format shows exactly, and an integer, print unchanged:

    >>> format_outward(2.0, ".1f", "up"), format_outward(99.96, ".1f", "up"), format_outward(-7, ".2f", "down")
    ('2.0', '100.0', '-7.00')
    """
    if direction not in (UP, DOWN):
        raise ValueError(f"direction must be {UP!r} or {DOWN!r}, not {direction!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a bound needs a number, not {type(value).__name__} {value!r}: glue the raw value")
    match = _SPEC.match(spec)
    if match is None:
        raise ValueError(f"format spec {spec!r}: a bound takes a spec ending in e, E, f, F, g, G or %")
    kind = match["type"]
    precision = int(match["precision"]) if match["precision"] is not None else 6
    # The shortest decimal that reads back as the float (its repr): rounding it outward gives a decimal whose
    # float is on the same side of the value, since reading decimals as floats keeps their order.
    exact = Decimal(repr(value))
    if not exact.is_finite():
        return format(value, spec)
    rounding = ROUND_CEILING if direction == UP else ROUND_FLOOR
    scaled = exact * 100 if kind == "%" else exact
    if kind in "fF%":
        quantum = Decimal(1).scaleb(-precision)
    else:  # e, E, g, G: significant digits
        digits = precision + 1 if kind in "eE" else max(precision, 1)
        if scaled.is_zero():
            return format(value, spec)
        quantum = Decimal(1).scaleb(scaled.adjusted() - digits + 1)
    rounded = scaled.quantize(quantum, rounding=rounding)
    if rounded.is_zero():
        rounded = abs(rounded)  # "-0.00" is no bound a reader can use: its sign is the float's, not the value's
    if kind == "%":
        rounded = rounded / 100
    # Back to a float so the text is Python's own (``1e-05``, not decimal's ``1e-5``): the float nearest to a
    # decimal of at most 17 significant digits formats back to that decimal, so no digit moves.
    return format(float(rounded), spec)


def _glue_role(direction):
    """A role like ``glue:text`` that formats with `format_outward` in `direction`."""
    from myst_nb.core.variables import RetrievalError
    from myst_nb.ext.glue.utils import glue_warning, retrieve_glue_data
    from myst_nb.ext.utils import RoleBase

    class PasteBoundRole(RoleBase):
        def run(self):
            key, _, spec = self.text.rpartition(":")
            if not key or not spec:
                return [], [glue_warning(f"glue:{direction} needs `name:spec`, got {self.text!r}", self.document,
                                         self.line)]
            if "::" in key:
                return [], [glue_warning(f"glue:{direction} reads only this page's glue, not {key!r}",
                                         self.document, self.line)]
            try:
                result = retrieve_glue_data(self.document, key)
            except RetrievalError as exc:
                return [], [glue_warning(str(exc), self.document, self.line)]
            try:
                text = format_outward(literal_eval(result.data["text/plain"]), spec, direction)
            except Exception as exc:  # any failure is a build warning
                return [], [glue_warning(f"glue:{direction} `{self.text}`: {exc}", self.document, self.line)]
            node = nodes.inline(text, text, classes=["pasted-text"])
            self.set_source_info(node)
            return [node], []

    return PasteBoundRole()


def setup(app):
    for direction in (UP, DOWN):
        app.add_role_to_domain("glue", direction, _glue_role(direction))
    return {"parallel_read_safe": True, "parallel_write_safe": True}

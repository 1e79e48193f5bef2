"""Reading time: each page's, and each reading path's on the landing page, computed when the book is built.

Adds what Sphinx and sphinx-book-theme do not have: a line under every MyST page's title, "Reading time: about
N minutes (...)", and a ``{reading-paths}`` directive for the landing page that lists each part of the book (each
toctree of ``docs/index.md`` whose caption begins "Part") with its pages and its total time. Nothing is typed:
both come from the pages, through the rule below, on every build.

The rule (stated once, here; the landing page states its weights) counts what a reader reads and gives each
count its seconds, :data:`SECONDS`:

* **prose words**: the page's Markdown outside code: no front matter, no fenced code (code cells, code blocks,
  ``literalinclude``, ``toctree``), no display math (``$$`` blocks) and no line that holds only inline math;
  directive options and MyST targets are not words. A role (``{glue:text}`name```, ``{ref}`label```) counts as
  one word, as does a stretch of inline math;
* **display equations**: each ``$$`` block;
* **figures**: each ``{glue:figure}``, ``{figure}`` or ``{image}``, and each image a code cell's output shows;
* **lines of code**: the non-blank lines of every code cell whose source the page shows, and of plain code
  blocks; a cell's options are not code;
* **lines of output**: what the shown outputs of the code cells print, by non-blank lines (:func:`shown_outputs`
  reads them from MyST-NB's doctree, where the executed outputs are nodes when ``doctree-read`` runs);
* **table rows**: each row of a Markdown table, its header included;
* **explorables**: each cell tagged ``explorable`` (``explorables``): a figure with controls to operate.

What a page folds away is not counted: the body of an admonition with the ``dropdown`` class (a "Going deeper"
box, which ``dropdowns`` shows closed; its title is counted), a cell whose source the page hides (``hide-cell``,
``hide-input``, ``remove-cell``, ``remove-input``: exercise solutions, drawing code) and an output the page hides
(``hide-cell``, ``hide-output``, ``remove-output``). A reader may open them, but need not.

Calibration. Two readers timed each page of Part I (issue 40); :data:`CALIBRATION` holds what the rule counted on
those pages (the sources of that day) and both times. The weights are the least-squares fit of the mean of the two
times on those counts, with one weight shared by a table row and a line of output (two pages hold tables: alone,
their weight is not determined), rounded to three significant figures (:func:`calibrate` refits them). The fit
predicts every page within 15% of the readers' mean:

===========================  ======  =====  ====  =====  ======  =====  =====  =====  =========  =====
page                         words   eqns   figs  code   output  rows   expl.  mean   predicted  error
===========================  ======  =====  ====  =====  ======  =====  =====  =====  =========  =====
The big picture              613     0      2     15     2       0      0      5.5    6.0        +9%
1 Queries, keys, values      993     1      5     40     10      6      1      13.0   13.9       +7%
Worked example               793     0      2     30     28      4      0      11.0   10.5       -5%
2 Dot products               762     2      5     51     0       0      0      9.5    9.9        +5%
3 Softmax                    657     4      2     23     3       0      0      7.0    7.7        +10%
4 Scaling                    889     4      3     19     0       0      1      11.0   10.9       -1%
5 Masks                      901     2      2     17     4       0      2      12.5   12.1       -3%
6 Causal decoding            677     0      1     25     9       0      0      6.5    7.1        +10%
7 Multi-head                 846     2      2     44     9       0      0      10.0   10.0       0%
8 Positions                  804     2      4     25     2       0      0      10.5   9.0        -14%
Where attention sits         632     0      3     47     3       0      0      8.0    7.9        -1%
Watching attention learn     671     1      3     75     3       0      0      10.0   9.6        -4%
===========================  ======  =====  ====  =====  ======  =====  =====  =====  =========  =====

(The old rule, 200 words a minute and 15 s a shown code cell, stated 57 minutes for these pages; the readers took
102 and 127; the fit gives 115.) :func:`prose_words` is the one definition of prose and :func:`reading` of the
whole count: ``tests/test_reading_time.py`` checks the book's budget with them (:data:`PART_I_PAGE_WORDS` per page
of Part I, Part I in at most :data:`PART_I_MINUTES` minutes) on the built pages' doctrees, and the calibration.

Public API only (``doctree-read``, ``doctree-resolved`` and ``env-get-outdated`` events, a directive and a node;
MyST-NB's documented cell containers). Verified with Sphinx 9.0.4, docutils 0.22 and MyST-NB 1.4.0.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

PART_I_PAGE_WORDS = 1600  # no page of Part I has more prose words than this
PART_I_MINUTES = 75  # Part I, the newcomer's path, reads in at most this many minutes

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\{[\w:-]+\})?")
_PROSE_DIRECTIVES = {
    "{admonition}", "{note}", "{important}", "{tip}", "{warning}", "{seealso}", "{glue:figure}", "{glossary}"
}
_FIGURES = {"{glue:figure}", "{figure}", "{image}"}  # directives that show one figure
_CODE = {"", "{code-cell}", "{code-block}", "{code}"}  # fences whose body is code a reader reads
_HIDDEN = re.compile(r"^:tags:.*\b(hide-cell|hide-input|remove-cell|remove-input)\b")
_EXPLORABLE = re.compile(r"^:tags:.*\bexplorable\b")
_ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")
_INLINE_MATH = re.compile(r"\$[^$]+\$")
_ONLY_MATH = re.compile(r"^(?:\$[^$]+\$[\s,.;:]*)+$")
_NOT_TEXT = re.compile(r"^(?::::?|\(.*\)=|:[\w-]+:.*)$")  # a colon fence, a MyST target, a directive option
_COLON_FENCE = re.compile(r"^\s*:{3,}\{[\w:-]+\}")  # ":::{admonition}" before a title
_COLON_CLOSE = re.compile(r"^:{3,}$")
_FOLDED = re.compile(r"^:class:.*\bdropdown\b")  # the option that folds an admonition
_TABLE_RULE = re.compile(r"^\|[\s:|-]*-[\s:|-]*$")  # the |---|---| line under a table's header
_WORD = re.compile(r"\w\S*")


# Seconds a reader spends on each thing a page shows: the fit of CALIBRATION (calibrate), to three figures.
SECONDS = {
    "words": 0.442,
    "equations": 14.3,
    "figures": 20.5,
    "code_lines": 2.51,
    "output_lines": 5.05,
    "table_rows": 5.05,
    "explorables": 97.0,
}
SHARED = ("output_lines", "table_rows")  # one weight: a table row reads like a line of output

# Part I as two readers timed it (issue 40): the counts of the rule on that day's sources, in the order of
# SECONDS, and each reader's minutes.
CALIBRATION = {
    "The big picture": ((613, 0, 2, 15, 2, 0, 0), (5, 6)),
    "1 Queries, keys, values": ((993, 1, 5, 40, 10, 6, 1), (12, 14)),
    "Worked example": ((793, 0, 2, 30, 28, 4, 0), (10, 12)),
    "2 Dot products": ((762, 2, 5, 51, 0, 0, 0), (8, 11)),
    "3 Softmax": ((657, 4, 2, 23, 3, 0, 0), (6, 8)),
    "4 Scaling": ((889, 4, 3, 19, 0, 0, 1), (10, 12)),
    "5 Masks": ((901, 2, 2, 17, 4, 0, 2), (12, 13)),
    "6 Causal decoding": ((677, 0, 1, 25, 9, 0, 0), (6, 7)),
    "7 Multi-head": ((846, 2, 2, 44, 9, 0, 0), (9, 11)),
    "8 Positions": ((804, 2, 4, 25, 2, 0, 0), (9, 12)),
    "Where attention sits": ((632, 0, 3, 47, 3, 0, 0), (7, 9)),
    "Watching attention learn": ((671, 1, 3, 75, 3, 0, 0), (8, 12)),
}


def calibrate(calibration=CALIBRATION) -> dict:
    """Seconds per count: the least-squares fit of the readers' mean times on the counts of `calibration`
    ({page: (counts in the order of SECONDS, (minutes, minutes))}), the counts named in SHARED sharing one weight.
    """
    import numpy as np  # only the calibration needs it

    names = list(SECONDS)
    shared = [names.index(name) for name in SHARED]
    counts = np.array([page for page, _ in calibration.values()], dtype=float)
    merged = np.delete(counts, shared[1:], axis=1)
    merged[:, shared[0]] += counts[:, shared[1:]].sum(axis=1)
    seconds = 60 * np.array([np.mean(times) for _, times in calibration.values()])
    fit, *_ = np.linalg.lstsq(merged, seconds, rcond=None)
    fit = list(fit)
    for index in shared[1:]:
        fit.insert(index, fit[shared[0]])
    return dict(zip(names, (float(value) for value in fit), strict=True))


@dataclass(frozen=True)
class Outputs:
    """What a page's executed cells show below their code: output lines and figures (folded outputs left out)."""

    lines: int = 0
    figures: int = 0


@dataclass(frozen=True)
class Reading:
    """What a page asks of a reader: the counts the rule weighs (the keys of :data:`SECONDS`)."""

    words: int = 0
    equations: int = 0
    figures: int = 0
    code_lines: int = 0
    output_lines: int = 0
    table_rows: int = 0
    explorables: int = 0

    @property
    def minutes(self) -> float:
        return sum(getattr(self, name) * seconds for name, seconds in SECONDS.items()) / 60


@dataclass
class _Scan:
    """What the source of a page shows: its prose and the counts of what is not prose."""

    prose: list = field(default_factory=list)
    code_cells: int = 0
    code_lines: int = 0
    equations: int = 0
    figures: int = 0
    table_rows: int = 0
    explorables: int = 0


def _body(text):
    """`text` without its YAML front matter."""
    if text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        if end >= 0:
            return text[end + 5 :]
    return text


class _Fence:
    """A backtick fence we are in: its marker, its directive, whether its options hide or make it an explorable,
    whether it stands in a fold, and the code lines it holds."""

    def __init__(self, marker, directive, folded):
        self.marker, self.directive, self.folded = marker, directive, folded
        self.hidden = self.explorable = False
        self.options, self.lines = bool(directive), 0  # a directive's body opens with its options

    def add(self, stripped):
        if self.options and stripped.startswith(":"):  # an option (:tags:, :mystnb: and its YAML, :name:)
            self.hidden = self.hidden or bool(_HIDDEN.match(stripped))
            self.explorable = self.explorable or bool(_EXPLORABLE.match(stripped))
            return
        self.options = False
        self.lines += bool(stripped)

    def close(self, scan):
        if self.folded:
            return
        if self.directive == "{code-cell}":
            scan.explorables += self.explorable
            if self.hidden:
                return
            scan.code_cells += 1
        if self.directive in _CODE:
            scan.code_lines += self.lines


def _scan(text):
    """The prose lines of a MyST page and the counts of what else it shows (folded content left out)."""
    scan, in_math = _Scan(), False
    fence = None  # the code fence we are in
    open_prose = []  # the backtick fences of the prose directives we are in
    colons = []  # the colon-fenced directives we are in: whether each is folded
    for line in _body(text).splitlines():
        stripped = line.strip()
        if fence is not None:  # inside a code fence: look for its options, then its end
            if stripped.startswith(fence.marker) and stripped.strip(fence.marker[0]) == "":
                fence.close(scan)
                fence = None
            else:
                fence.add(stripped)
            continue
        if open_prose and stripped == open_prose[-1]:  # the end of a prose directive
            open_prose.pop()
            continue
        folded = any(colons)
        opening = _FENCE.match(stripped)
        if opening:
            directive = opening.group(2) or ""
            scan.figures += directive in _FIGURES and not folded
            if directive in _PROSE_DIRECTIVES:  # a directive whose body is prose (an admonition, a caption)
                open_prose.append(opening.group(1))
            else:
                fence = _Fence(opening.group(1), directive, folded)
            continue
        if stripped.startswith("$$"):
            opens = not in_math
            in_math = not in_math if stripped == "$$" or not stripped.endswith("$$") else in_math
            scan.equations += opens and not folded
            continue
        if _COLON_FENCE.match(stripped):
            colons.append(False)
            if folded:
                continue
        elif _COLON_CLOSE.match(stripped) and colons:
            colons.pop()
            continue
        elif colons and _FOLDED.match(stripped):
            colons[-1] = True
            continue
        if in_math or _NOT_TEXT.match(stripped) or _ONLY_MATH.match(stripped):
            continue
        if folded:  # inside a folded box (its title, on the opening line, was counted)
            continue
        if stripped.startswith("|") and not _TABLE_RULE.match(stripped):
            scan.table_rows += 1
        scan.prose.append(_COLON_FENCE.sub("", line))
    return scan


def prose_words(text: str) -> int:
    """The number of prose words of a MyST page's source `text` (the rule in the module docstring)."""
    prose = "\n".join(_scan(text).prose)
    return len(_WORD.findall(_INLINE_MATH.sub(" x ", _ROLE.sub(" x ", prose))))


def reading(text: str, outputs: Outputs = Outputs()) -> Reading:
    """What a MyST page whose source is `text` shows a reader, its executed cells showing `outputs`."""
    scan = _scan(text)
    return Reading(
        words=prose_words(text),
        equations=scan.equations,
        figures=scan.figures + outputs.figures,
        code_lines=scan.code_lines,
        output_lines=outputs.lines,
        table_rows=scan.table_rows,
        explorables=scan.explorables,
    )


def _is_cell(node):
    return isinstance(node, nodes.container) and node.get("nb_element") == "cell_code"


def _in_fold(node):
    """Whether `node` stands in an admonition with the dropdown class."""
    parent = node.parent
    while parent is not None:
        if isinstance(parent, nodes.Admonition) and "dropdown" in parent.get("classes", []):
            return True
        parent = parent.parent
    return False


def _lines(text):
    """The lines of printed output a reader reads: the non-blank ones."""
    return sum(1 for line in text.splitlines() if line.strip())


def shown_outputs(doctree) -> Outputs:
    """The output lines and figures that the code cells of a MyST-NB `doctree` show unfolded.

    MyST-NB puts each code cell in the doctree (at ``doctree-read``) as a container with ``nb_element`` "cell_code",
    its tags in ``cell_metadata`` and, when it hides its output, a ``hide_mode``; its outputs follow, in a
    "cell_code_output" container, as literal blocks (streams) and one "mime_bundle" container per rich output,
    a container per MIME type inside. A bundle with an image is one figure; else its plain text counts by its
    non-blank lines, as a stream does.
    An explorable's output is counted as an explorable, from the source.
    """
    lines = figures = 0
    for cell in doctree.findall(_is_cell):
        tags = cell.get("cell_metadata", {}).get("tags", [])
        if cell.get("hide_mode") in {"all", "output", "input+output"} or "explorable" in tags or _in_fold(cell):
            continue
        outputs = cell.findall(lambda n: isinstance(n, nodes.container) and n.get("nb_element") == "cell_code_output")
        for output in outputs:
            for child in output.children:
                if isinstance(child, nodes.container) and child.get("nb_element") == "mime_bundle":
                    kinds = {part.get("mime_type", ""): part for part in child.children}
                    if any(kind.startswith("image/") for kind in kinds):
                        figures += 1
                    elif "text/plain" in kinds:
                        lines += _lines(kinds["text/plain"].astext())
                elif isinstance(child, nodes.figure):  # an image output MyST-NB placed in a figure
                    figures += 1
                else:
                    lines += _lines(child.astext())
    return Outputs(lines, figures)


def minutes_text(minutes: float) -> str:
    """'about 12 minutes': to the nearest whole minute, at least one."""
    whole = max(1, math.floor(minutes + 0.5))  # half a minute rounds up
    return f"about {whole} minute{'s' if whole != 1 else ''}"


def parts(index_text: str) -> list[tuple[str, list[str]]]:
    """Each captioned toctree of the landing page's source: (caption, [docname, ...]) in reading order."""
    found, caption, entries, inside = [], None, [], False
    for line in index_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```{toctree}"):
            caption, entries, inside = None, [], True
        elif inside and stripped.startswith("```"):
            if caption:
                found.append((caption, entries))
            inside = False
        elif inside and stripped.startswith(":caption:"):
            caption = stripped.removeprefix(":caption:").strip()
        elif inside and stripped and not stripped.startswith(":"):
            entries.append(stripped)
    return found


# -- Sphinx -------------------------------------------------------------------------------------------------


def _source(env, docname):
    return Path(env.doc2path(docname)).read_text(encoding="utf-8")


# How the line under a title and the landing page name each count: (one, many).
_NAMES = {
    "words": ("word of prose", "words of prose"),
    "equations": ("equation", "equations"),
    "figures": ("figure", "figures"),
    "code_lines": ("line of code", "lines of code"),
    "output_lines": ("line of output", "lines of output"),
    "table_rows": ("table row", "table rows"),
    "explorables": ("explorable", "explorables"),
}


def _count(name, number):
    one, many = _NAMES[name]
    return f"{number:,} {one if number == 1 else many}"


def line_text(page: Reading) -> str:
    """The line under a page's title: its time, and what the page shows (only what it has)."""
    counts = ", ".join(_count(name, getattr(page, name)) for name in _NAMES if getattr(page, name))
    return f"Reading time: {minutes_text(page.minutes)} ({counts or 'nothing to read'})"


def rule_text() -> str:
    """The rule, as the landing page states it under the reading paths."""
    def seconds(value):
        return f"{value:g} s"
    weights = ", ".join(f"{seconds(SECONDS[name])} per {_NAMES[name][0]}" for name in _NAMES)
    return (
        f"Reading times weigh what a page shows: {weights} (fitted to two readers' timings of Part I). "
        "What a page folds away "
        "(solutions, hidden cells, \u201cGoing deeper\u201d boxes) is not counted."
    )


def _line(page: Reading):
    text = line_text(page)
    return nodes.paragraph(text, text, classes=["reading-time"])


def _is_page(env, docname):
    return docname != env.config.root_doc and str(env.doc2path(docname)).endswith(".md")


def add_reading_time(app, doctree):
    """Under the title of every MyST page but the landing page: the page's reading time, also kept for the
    landing page's totals."""
    env = app.env
    if not _is_page(env, env.docname):
        return
    page = reading(_source(env, env.docname), shown_outputs(doctree))
    env.metadata[env.docname]["reading_time"] = json.dumps(asdict(page))
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None or not section.children or not isinstance(section[0], nodes.title):
        return
    section.insert(1, _line(page))


def page_reading(env, docname) -> Reading:
    """The reading `add_reading_time` found for `docname` (nothing, for a page it did not count)."""
    stored = env.metadata.get(docname, {}).get("reading_time")
    return Reading(**json.loads(stored)) if stored else Reading()


class reading_paths(nodes.General, nodes.Element):
    """Where the ``{reading-paths}`` directive stands, until every page's source is known."""


class ReadingPaths(SphinxDirective):
    """``{reading-paths}``: each part of the book, its pages and its total reading time."""

    def run(self):
        self.env.metadata[self.env.docname]["reading_paths"] = "1"
        return [reading_paths()]


def fill_reading_paths(app, doctree, docname):
    """Replace the placeholder with one item per part: its name, its pages and its total time."""
    env = app.env
    for placeholder in list(doctree.findall(reading_paths)):
        listing = nodes.bullet_list(classes=["reading-paths"])
        for caption, docnames in parts(_source(env, docname)):
            if not caption.startswith("Part "):  # "Reference" is not a reading path
                continue
            total = sum(page_reading(env, name).minutes for name in docnames)
            item = nodes.paragraph()
            item += nodes.strong(caption, caption)
            item += nodes.Text(f": {len(docnames)} pages, {minutes_text(total)}, starting with ")
            first = docnames[0]
            ref = nodes.reference("", "", internal=True, refuri=app.builder.get_relative_uri(docname, first))
            ref += nodes.Text(env.titles[first].astext() if first in env.titles else first)
            item += ref
            item += nodes.Text(".")
            listing += nodes.list_item("", item)
        rule = rule_text()
        placeholder.replace_self([listing, nodes.paragraph(rule, rule, classes=["reading-time"])])


def outdated_with_any_page(app, env, added, changed, removed):
    """A page listing the paths' times is rebuilt whenever any page changes (its totals depend on them all)."""
    if not (added or changed or removed):
        return []
    return [name for name, meta in env.metadata.items() if meta.get("reading_paths") and name not in changed]


def setup(app):
    app.add_node(reading_paths)
    app.add_directive("reading-paths", ReadingPaths)
    app.connect("doctree-read", add_reading_time)
    app.connect("doctree-resolved", fill_reading_paths)
    app.connect("env-get-outdated", outdated_with_any_page)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

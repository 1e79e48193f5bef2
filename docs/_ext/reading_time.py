"""Reading time: each page's, and each reading path's on the landing page, computed from the sources at build time.

Adds what Sphinx and sphinx-book-theme do not have: a line under every MyST page's title, "Reading time: about
N minutes", and a ``{reading-paths}`` directive for the landing page that lists each part of the book (each
toctree of ``docs/index.md`` whose caption begins "Part") with its pages and its total time. Nothing is typed:
both come from the page sources, through the rule below, on every build.

The rule (stated once, here, and in the line each page shows):

* **Prose words** at :data:`WORDS_PER_MINUTE`. Prose is the page's Markdown outside code: no front matter, no
  fenced code (code cells, code blocks, ``literalinclude``, ``toctree``), no display math (``$$`` blocks) and no
  line that holds only inline math; directive options and MyST targets are not words. A role
  (``{glue:text}`name```, ``{ref}`label```) counts as one word, as does a stretch of inline math.
  What a page folds away is not counted: the body of an admonition with the ``dropdown`` class (a "Going
  deeper" box, which ``dropdowns`` shows closed); its title is.
* **Code cells shown on the page** at :data:`SECONDS_PER_CODE_CELL` each. A cell whose source the page hides
  (``hide-cell``, ``hide-input``, ``remove-cell``, ``remove-input``: the exercise solutions, drawing code) is not
  counted: a reader may open it, but need not.

:func:`prose_words` is the one definition of prose: ``tests/test_reading_time.py`` checks the book's word budget
with it (:data:`PART_I_PAGE_WORDS` per page of Part I, Part I in at most :data:`PART_I_MINUTES` minutes).

Public API only (``doctree-read``, ``doctree-resolved`` and ``env-get-outdated`` events, a directive and a node).
Verified with Sphinx 9.0.4, docutils 0.22 and MyST-NB 1.3.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

WORDS_PER_MINUTE = 200
SECONDS_PER_CODE_CELL = 15
PART_I_PAGE_WORDS = 1600  # no page of Part I has more prose words than this
PART_I_MINUTES = 60  # Part I, the newcomer's path, reads in at most this many minutes

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\{[\w:-]+\})?")
_PROSE_DIRECTIVES = {
    "{admonition}", "{note}", "{important}", "{tip}", "{warning}", "{seealso}", "{glue:figure}", "{glossary}"
}
_HIDDEN = re.compile(r"^:tags:.*\b(hide-cell|hide-input|remove-cell|remove-input)\b")
_ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")
_INLINE_MATH = re.compile(r"\$[^$]+\$")
_ONLY_MATH = re.compile(r"^(?:\$[^$]+\$[\s,.;:]*)+$")
_NOT_TEXT = re.compile(r"^(?::::?|\(.*\)=|:[\w-]+:.*)$")  # a colon fence, a MyST target, a directive option
_COLON_FENCE = re.compile(r"^\s*:{3,}\{[\w:-]+\}")  # ":::{admonition}" before a title
_COLON_CLOSE = re.compile(r"^:{3,}$")
_FOLDED = re.compile(r"^:class:.*\bdropdown\b")  # the option that folds an admonition
_WORD = re.compile(r"\w\S*")


@dataclass(frozen=True)
class Reading:
    """What a page asks of a reader: its prose words and the code cells it shows."""

    words: int
    code_cells: int

    @property
    def minutes(self) -> float:
        return self.words / WORDS_PER_MINUTE + self.code_cells * SECONDS_PER_CODE_CELL / 60


def _body(text):
    """`text` without its YAML front matter."""
    if text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        if end >= 0:
            return text[end + 5 :]
    return text


def _split(text):
    """The prose lines of a MyST page and the number of code cells it shows."""
    prose, shown, in_math = [], 0, False
    fence = is_cell = hidden = None  # the code fence we are in, whether it is a code cell, whether it is hidden
    open_prose = []  # the backtick fences of the prose directives we are in
    colons = []  # the colon-fenced directives we are in: whether each is folded
    for line in _body(text).splitlines():
        stripped = line.strip()
        if fence is not None:  # inside a code fence: look for its options, then its end
            hidden = hidden or bool(_HIDDEN.match(stripped))
            if stripped.startswith(fence) and stripped.strip(fence[0]) == "":
                shown += bool(is_cell and not hidden)
                fence = None
            continue
        if open_prose and stripped == open_prose[-1]:  # the end of a prose directive
            open_prose.pop()
            continue
        opening = _FENCE.match(stripped)
        if opening and (opening.group(2) or "") not in _PROSE_DIRECTIVES:
            fence, is_cell, hidden = opening.group(1), opening.group(2) == "{code-cell}", False
            continue
        if opening:  # a directive whose body is prose (an admonition, a figure's caption)
            open_prose.append(opening.group(1))
            continue
        if stripped.startswith("$$"):
            in_math = not in_math if stripped == "$$" or not stripped.endswith("$$") else in_math
            continue
        if _COLON_FENCE.match(stripped):
            folded_outside = any(colons)
            colons.append(False)
            if folded_outside:
                continue
        elif _COLON_CLOSE.match(stripped) and colons:
            colons.pop()
            continue
        elif colons and _FOLDED.match(stripped):
            colons[-1] = True
            continue
        if in_math or _NOT_TEXT.match(stripped) or _ONLY_MATH.match(stripped):
            continue
        if colons and any(colons):  # inside a folded box (its title, on the opening line, was counted)
            continue
        prose.append(_COLON_FENCE.sub("", line))
    return "\n".join(prose), shown


def prose_words(text: str) -> int:
    """The number of prose words of a MyST page's source `text` (the rule in the module docstring)."""
    prose, _ = _split(text)
    return len(_WORD.findall(_INLINE_MATH.sub(" x ", _ROLE.sub(" x ", prose))))


def reading(text: str) -> Reading:
    """Prose words and shown code cells of a MyST page's source `text`."""
    return Reading(prose_words(text), _split(text)[1])


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


def line_text(page: Reading) -> str:
    """The line under a page's title; it names code cells only where the page shows some."""
    cells = (
        f", {page.code_cells} code cell{'s' if page.code_cells != 1 else ''} at {SECONDS_PER_CODE_CELL} s each"
        if page.code_cells else ""
    )
    prose = f"{page.words:,} words of prose at {WORDS_PER_MINUTE} a minute"
    return f"Reading time: {minutes_text(page.minutes)} ({prose}{cells})"


def _line(page: Reading):
    text = line_text(page)
    return nodes.paragraph(text, text, classes=["reading-time"])


def add_reading_time(app, doctree):
    """Under the title of every MyST page but the landing page: the page's reading time."""
    env = app.env
    if env.docname == env.config.root_doc or not str(env.doc2path(env.docname)).endswith(".md"):
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None or not section.children or not isinstance(section[0], nodes.title):
        return
    section.insert(1, _line(reading(_source(env, env.docname))))


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
            total = sum(reading(_source(env, name)).minutes for name in docnames if name in env.found_docs)
            item = nodes.paragraph()
            item += nodes.strong(caption, caption)
            item += nodes.Text(f": {len(docnames)} pages, {minutes_text(total)}, starting with ")
            first = docnames[0]
            ref = nodes.reference("", "", internal=True, refuri=app.builder.get_relative_uri(docname, first))
            ref += nodes.Text(env.titles[first].astext() if first in env.titles else first)
            item += ref
            item += nodes.Text(".")
            listing += nodes.list_item("", item)
        rule = (
            f"Reading times count prose at {WORDS_PER_MINUTE} words a minute and {SECONDS_PER_CODE_CELL} s for "
            "each code cell a page shows; hidden solutions are not counted."
        )
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

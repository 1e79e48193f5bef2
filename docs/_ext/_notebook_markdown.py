"""A chapter's MyST Markdown cells as the Markdown Jupyter and Colab render: the book's text in its notebooks.

Corrects what MyST-NB's notebooks (its executed ``jupyter_execute/<page>.ipynb`` and its reading of a chapter)
carry: the chapter's MyST source verbatim, which no notebook front end understands. A reader of the notebook
would see ``{glue:text}`name:.3f``` where the book prints a number, ``{ref}`ch-memory``` where it links a
chapter, ``:::{admonition}`` fences and no figure. Here each Markdown cell is rewritten:

- ``{glue:text}`` / ``{glue:md}`` / ``{glue}`` roles become the glued value, formatted as the book formats it
  (MyST-NB's own ``format_plain_text``), from the executed notebook's glue outputs;
- ``{ref}``, ``{doc}``, ``{numref}`` and the Python-domain roles (``{func}``, ``{class}``, ...) become plain text,
  or Markdown links where the target's address is known (the hosted page, when the site's URL is; Python's and
  NumPy's own pages, from the intersphinx inventories);
- admonitions (``:::{note}``, ``:::{admonition} Title``) become a blockquote with a bold title, and a solution
  (an admonition with the ``dropdown`` class, or ``{dropdown}``) a collapsed ``<details>`` block;
- ``{glue:figure}`` shows the glued image (a ``data:`` URI, so the notebook needs no other file) with its alt
  text and caption; ``{literalinclude}`` becomes a fenced code block holding the lines the book shows;
- target lines ``(label)=`` and ``%`` comments are dropped; math (``$...$``, ``$$...$$``) is left as it is.

A directive or role it does not know stops the build (``UnknownMarkup``) rather than leaving markup a reader
would see. Code cells the book hides (``hide-cell``, ``hide-input`` tags) get ``jupyter.source_hidden`` (and
``hide-output`` ``jupyter.outputs_hidden``), which JupyterLab and VS Code honour.

Corrects for exercise solutions (the hidden code cells directly after a Markdown cell that ends with an
``Exercise`` admonition, `mark_solutions`): Colab ignores ``jupyter.source_hidden``, so a solution opened there
showed in full under its exercise. A solution cell becomes a Colab form cell: its first line ``#@title Solution
to Exercise N.M { display-mode: "form" }`` and ``metadata.cellView = "form"``, which Colab shows as the title
alone until the reader chooses "Show code"; its outputs are left out (running it shows them), and its
``glue(...)`` statements, the book's plumbing, are taken out (``solutions.without_glue``).

Used by ``notebook_download`` for every downloaded notebook; the committed notebooks of ``_launch_notebooks``
are made from those, so both carry the same text. The values, links and includes come from a ``Book`` that
``notebook_download`` fills: the values from the executed notebook's glue outputs as the jupyter cache holds
them (MyST-NB drops the ``display=False`` ones from the notebook it writes), the links from the Sphinx
environment (``std`` labels, ``env.titles``, ``py`` objects, intersphinx's ``InventoryAdapter``), the includes
through Sphinx's ``LiteralIncludeReader``. Uses MyST-NB's ``format_plain_text`` (how ``{glue:text}`` formats a
value). Verified with Sphinx 9.0.4 and MyST-NB 1.4.0.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from myst_nb.core.variables import format_plain_text
from solutions import without_glue

GLUE_PREFIX = "application/papermill.record/"
# A role in MyST: {name}`content`, content with no backtick.
ROLE = re.compile(r"\{(?P<name>[A-Za-z][\w:+-]*)\}`(?P<content>[^`]*)`")
# The opening line of a directive fence: ``` or ::: (three or more), {name}, argument.
FENCE_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:+-]+)\}\s*(?P<argument>.*?)\s*$")
PLAIN_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})")
TARGET_LINE = re.compile(r"^\s*\([\w:.-]+\)=\s*$")
COMMENT_LINE = re.compile(r"^\s*%")
# Sphinx writes these roles' targets with parentheses (add_function_parentheses).
CALLABLE_ROLES = {"func", "meth"}
PYTHON_ROLES = {"func", "class", "meth", "attr", "mod", "data", "obj", "exc", "const"}
ADMONITION_TITLES = {
    "note": "Note", "important": "Important", "tip": "Tip", "hint": "Hint", "warning": "Warning",
    "caution": "Caution", "attention": "Attention", "danger": "Danger", "error": "Error", "seealso": "See also",
}
HIDDEN_SOURCE_TAGS = {"hide-cell", "hide-input", "remove-input"}
HIDDEN_OUTPUT_TAGS = {"hide-cell", "hide-output", "remove-output"}
# The opening line of an exercise (":::{admonition} Exercise 4.2") and of any colon-fenced directive.
EXERCISE_OPEN = re.compile(r"^ {0,3}:{3,}\{admonition\}\s*(?P<title>Exercise\b.*?)\s*$", re.MULTILINE)
COLON_OPEN = re.compile(r"^ {0,3}:{3,}\{", re.MULTILINE)
SOLUTION_TAGS = {"hide-cell"}


class UnknownMarkup(ValueError):
    """MyST markup the converter cannot turn into plain Markdown (it would reach readers as raw text)."""


@dataclass
class Book:
    """What the conversion needs to know about the book, for one page.

    ``glue``: the page's glued values, ``{name: mime bundle}``. ``link(role, target)``: ``(text, url)`` for a
    cross-reference role (``url`` None when no address is known; ``text`` None when the target is unknown).
    ``include(argument, options)``: the text and language a ``literalinclude`` shows.
    """

    glue: dict = field(default_factory=dict)
    link: Callable[[str, str], tuple[str | None, str | None]] = lambda role, target: (None, None)
    include: Callable[[str, dict], tuple[str, str]] | None = None
    page: str = ""


def glue_values(notebook):
    """``{name: mime bundle}`` of the values a notebook's code glued (display or not)."""
    values = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            record = output.get("metadata", {}).get("scrapbook")
            if output.get("output_type") == "display_data" and record:
                values[record["name"]] = {key.removeprefix(GLUE_PREFIX): value
                                          for key, value in output.get("data", {}).items()}
    return values


def _text(value):
    return "".join(value) if isinstance(value, list) else value


def _glued(book, name):
    if name not in book.glue:
        raise UnknownMarkup(f"{book.page}: no value glued as {name!r} in the executed notebook (MyST-NB keeps the "
                            "values glued with display=False only in its cache: nb_execution_mode must be 'cache')")
    return book.glue[name]


def _role(book, match):
    """The plain Markdown of one role."""
    name, content = match["name"], match["content"]
    if name in ("glue:text", "glue", "glue:md"):
        key, _, fmt = content.rpartition(":") if name != "glue" and ":" in content else (content, "", "")
        bundle = _glued(book, key)
        if name == "glue:md":  # its value is MyST Markdown too
            return to_markdown(bundle.get("text/markdown", format_plain_text(_text(bundle["text/plain"]), "s")), book)
        return format_plain_text(_text(bundle["text/plain"]), fmt or "s")
    if name in ("glue:up", "glue:down"):  # a bound, rounded outward as the book prints it (``bounds``)
        from ast import literal_eval

        from bounds import format_outward

        key, _, fmt = content.rpartition(":")
        return format_outward(literal_eval(_text(_glued(book, key)["text/plain"])), fmt, name.removeprefix("glue:"))
    if name in ("ref", "doc", "numref", "any") or name.removeprefix("py:") in PYTHON_ROLES:
        return _cross_reference(book, name.removeprefix("py:"), content)
    if name in ("math",):
        return f"${content}$"
    if name == "term":  # a glossary term: its words, as the page shows them
        explicit = re.fullmatch(r"(?s)(?P<title>.*?)\s*<(?P<target>[^<>]+)>", content)
        return explicit["title"] if explicit else content
    if name in ("sub", "sup", "abbr", "kbd", "samp", "code", "file", "command", "program", "guilabel"):
        return f"`{content}`" if name in ("samp", "code", "file", "command", "program", "kbd") else content
    raise UnknownMarkup(f"{book.page}: role {{{name}}} has no Markdown form here")


def _cross_reference(book, role, content):
    explicit = re.fullmatch(r"(?s)(?P<title>.*?)\s*<(?P<target>[^<>]+)>", content)
    title, target = (explicit["title"], explicit["target"]) if explicit else (None, content)
    target = target.lstrip("!")
    short = target.startswith("~")
    target = target.lstrip("~")
    text, url = book.link(role, target)
    if role in PYTHON_ROLES:
        shown = title or (target.rsplit(".", 1)[-1] if short else target)
        if not title and role in CALLABLE_ROLES:
            shown += "()"
        text = f"`{shown}`" if not title else shown
    else:
        if text is None and title is None:
            raise UnknownMarkup(f"{book.page}: {{{role}}} target {target!r} is not in the book")
        text = title or text
    return f"[{text}]({url})" if url else text


def _roles(book, line):
    return ROLE.sub(lambda match: _role(book, match), line)


def _options(lines):
    """A directive body's leading ``:key: value`` options (or a ``---`` YAML block) and the lines after them."""
    options, index = {}, 0
    if lines and lines[0].strip() == "---":
        end = lines.index("---", 1) if "---" in lines[1:] else len(lines)
        for line in lines[1:end]:
            key, _, value = line.partition(":")
            options[key.strip()] = value.strip()
        return options, lines[end + 1:]
    while index < len(lines) and re.match(r"^:[\w-]+:", lines[index]):
        key, _, value = lines[index][1:].partition(":")
        options[key] = value.strip()
        index += 1
    return options, lines[index:]


def _quoted(lines):
    return [("> " + line).rstrip() for line in lines]


def _directive(book, name, argument, body):
    """The Markdown lines of one directive (its body already converted where it is Markdown)."""
    if name in ("code-cell", "code-block", "code", "sourcecode"):
        options, code = _options(body)
        return [f"```{argument or ''}".rstrip(), *code, "```"]
    if name == "literalinclude":
        options, _ = _options(body)
        if book.include is None:
            raise UnknownMarkup(f"{book.page}: literalinclude of {argument!r} with no reader")
        text, language = book.include(argument, options)
        return [f"```{language}", *text.rstrip("\n").split("\n"), "```"]
    options, rest = _options(body)
    rest = _markdown_lines(book, rest)
    if name == "glue:figure":
        bundle = _glued(book, argument)
        image = next((mime for mime in ("image/png", "image/jpeg", "image/svg+xml") if mime in bundle), None)
        if image is None:
            raise UnknownMarkup(f"{book.page}: {argument!r} glued no image")
        data = _text(bundle[image])
        encoded = base64.b64encode(data.encode()).decode() if image == "image/svg+xml" else data.replace("\n", "")
        alt = options.get("alt", "").replace("[", "(").replace("]", ")")
        return [f"![{alt}](data:{image};base64,{encoded})", "", *rest]
    classes = options.get("class", "").split()
    if name == "dropdown" or (name == "admonition" and "dropdown" in classes):
        title = argument or "Solution"
        return ["<details>", f"<summary>{title}</summary>", "", *rest, "", "</details>"]
    if name == "admonition" or name in ADMONITION_TITLES:
        title = argument if name == "admonition" else ADMONITION_TITLES[name]
        return _quoted([f"**{title}**", "", *rest])
    raise UnknownMarkup(f"{book.page}: directive {{{name}}} has no Markdown form here")


def _markdown_lines(book, lines):
    """Convert MyST Markdown `lines` (no line endings) to plain Markdown lines."""
    out, prose, index = [], [], 0

    def flush():  # roles may span lines: convert a run of prose at once
        if prose:
            out.extend(_roles(book, "\n".join(prose)).split("\n"))
            prose.clear()

    while index < len(lines):
        line = lines[index]
        opening, plain = FENCE_OPEN.match(line), PLAIN_FENCE.match(line)
        if opening or plain:
            flush()
            fence = (opening or plain)["fence"]
            closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
            end = index + 1
            while end < len(lines) and not closing.match(lines[end]):
                end += 1
            body = lines[index + 1:end]
            if opening:
                out += _directive(book, opening["name"], _roles(book, opening["argument"]), body)
            else:
                out += [line, *body, lines[end] if end < len(lines) else fence]
            index = end + 1
            continue
        if not (TARGET_LINE.match(line) or COMMENT_LINE.match(line)):
            prose.append(line)
        index += 1
    flush()
    return out


def to_markdown(source, book):
    """The plain Markdown of the MyST Markdown `source` of one cell."""
    lines = _markdown_lines(book, _text(source).split("\n"))
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def _glue_record(output):
    """Whether `output` is a value glued with ``display=False``: data under MyST-NB's prefix only, for the book."""
    data = output.get("data", {})
    return bool(output.get("metadata", {}).get("scrapbook")) and bool(data) and all(
        key.startswith(GLUE_PREFIX) for key in data)


def _ending_exercise(source):
    """The title of the exercise the MyST Markdown `source` ends with (nothing but its close after it), or None."""
    text = _text(source).rstrip()
    openings = list(COLON_OPEN.finditer(text))
    exercise = EXERCISE_OPEN.match(text, openings[-1].start()) if openings else None
    if exercise is None:
        return None
    fence = re.match(r" {0,3}(:{3,})", text[exercise.start():]).group(1)
    return exercise["title"] if text.endswith(fence) else None


def solution_titles(cells):
    """``{index: exercise title}`` of the solution cells among `cells` (MyST Markdown and code cells, in order):
    each hidden code cell directly after a Markdown cell that ends with an exercise, and each hidden code cell
    directly after one of those."""
    found, title = {}, None
    for index, cell in enumerate(cells):
        if cell.get("cell_type") == "markdown":
            title = _ending_exercise(cell["source"])
            continue
        if cell.get("cell_type") == "code" and title and SOLUTION_TAGS & set(cell.get("metadata", {}).get("tags", [])):
            found[index] = title
        else:
            title = None
    return found


def as_solution(cell, title):
    """Solution cell `cell` as Colab and Jupyter show a solution: titled, folded, no outputs, no glue()."""
    source = without_glue(_text(cell["source"]))
    cell["source"] = f'#@title Solution to {title} {{ display-mode: "form" }}\n{source}'
    cell["outputs"] = []
    metadata = cell.setdefault("metadata", {})
    metadata["cellView"] = "form"
    metadata.setdefault("jupyter", {}).update(source_hidden=True, outputs_hidden=True)
    return cell


def for_readers(notebook, book):
    """The notebook with its Markdown cells in plain Markdown, the book's hidden code cells collapsed and the
    glued-only values dropped from the outputs (they are written into the Markdown; front ends other than MyST-NB
    have no renderer for their MIME types, and VS Code says so under the cell), and the solutions folded in a way
    Colab honours too (`as_solution`)."""
    solutions = solution_titles(notebook.get("cells", []))
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") == "markdown":
            cell["source"] = to_markdown(cell["source"], book)
        elif cell.get("cell_type") == "code":
            cell["outputs"] = [output for output in cell.get("outputs", []) if not _glue_record(output)]
            tags = set(cell.get("metadata", {}).get("tags", []))
            hidden = {key: True for key, hiding in (("source_hidden", HIDDEN_SOURCE_TAGS),
                                                    ("outputs_hidden", HIDDEN_OUTPUT_TAGS)) if tags & hiding}
            if hidden:
                cell.setdefault("metadata", {}).setdefault("jupyter", {}).update(hidden)
            if index in solutions:
                as_solution(cell, solutions[index])
    return notebook

r"""The built book states nothing its code does not produce, and shows readers no raw TeX and no file names.

Three checks over the pages of ``docs/_build/html`` (``make test`` builds it first; ``BOOK_SITE`` points them
at another build), each with a self-test that breaks a copy of a real page and sees the check fail:

* **Typed numbers.** Every number in a page's prose comes from executed code (a myst-nb ``glue``) or is
  listed once in ``docs/prose_numbers.toml`` with the cell or test that asserts it. "Prose" is the rendered
  text outside code cells and their outputs, glued values, heading and exercise numbering, and citations;
  it includes captions, admonitions, tables, the alt text of every image (a glued figure's, a cell output's),
  and math that is more than notation. In math a literal counts when it has two or more digits or a decimal
  point, or when it is a value given to something: a digit standing right after a relation, or in a list
  that follows one (``d_k = 8``, ``2^{-24}``, ``L = S = 65,536``, the ``5`` of ``d_k = 1, \dots, 5``). In
  inline math, where the prose sets its parameters, that includes ``0`` and ``1`` when what they are given
  to is a single symbol (``$d_k = 1$``, ``$\rho = 1$``); an identity such as ``\sum_j \alpha_j = 1`` and
  display math's derivations ending in ``= 1`` stay notation, as do exponents such as ``n^2``. Spelled-out
  numbers from "four" up ("five decades", "hundreds of") count too, and
  so do "twice" and "thrice"; "two", "three" and "half" are left out because English uses them for things
  that are not quantities ("the two faces", "half precision", "each half of the row"). Ordinals written with
  digits ("the 7th digit") count, and so does inline code in the prose (not code cells) when it holds a
  literal beyond notation, as in math: two or more digits, a decimal point or an exponent (``atol=1e-5``,
  ``(2, 16, 64)``, ``10 * eps``). Notation and names are not counted: ``axis=-1``, ``float16``, the values
  zero and one (``scale=0.0``), an exponent (``** -0.5``), and a span that is one literal and nothing else
  outside a table, which names a constant the prose talks about (``-1e9``); in a table cell it counts.
  The API reference pages are left out: their numbers are in docstrings, whose examples run as doctests.
* **No raw TeX where math is not typeset**: the browser title, link texts, the sidebar and previous/next
  links, the search index's titles, and the names of the downloadable notebooks.
* **Figures have alt text** that says what they show: present, at least a few words, not a file path, and
  different for every figure in the book.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import IN_CI, require

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("BOOK_SITE", ROOT / "docs" / "_build" / "html"))
ALLOWED = ROOT / "docs" / "prose_numbers.toml"
NOT_PAGES = ("_static/", "_images/", "_sources/", "_modules/", "genindex", "search.html", "py-modindex")
# Pages whose numbers are not prose: the API reference (docstrings, checked as doctests) and the bibliography
# (years, volumes and pages of citations).
NOT_PROSE = ("api/", "references.html")

pytestmark = pytest.mark.docs

# A numeral standing alone: not part of a name (float16, x_2, ^2, \frac12) and not followed by letters other
# than "x" ("3x faster" counts, "2D" does not).
_PROSE_NUMBER = re.compile(r"(?<![\w.^_\\/#-])[-−]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+−]?\d+)?(?![A-Za-wyz_\d])")
_NUMBER_WORD = re.compile(
    r"\b(four|five|six|seven|eight|nine|ten|tens|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen"
    r"|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundreds?|thousands?|millions?"
    r"|billions?|dozens?)\b",
    re.IGNORECASE,
)
_MATH_LITERAL = re.compile(r"(?<![A-Za-z\\])\d+(?:,\d{3})*(?:\.\d+)?")
# An ordinal written with digits: "7th", "21st", "2nd".
_ORDINAL = re.compile(r"(?<![\w.])\d+(?:st|nd|rd|th)\b")
# Words for a multiple.
_MULTIPLE_WORD = re.compile(r"\b(twice|thrice)\b", re.IGNORECASE)
# A literal in inline code: a number not inside a name (float16, x2), with its decimals and exponent.
_CODE_LITERAL = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
_CODE_EXPONENT = re.compile(r"(?:\*\*|\^)\s*-?\s*$")  # what precedes an exponent: "** -0.5"
_ONE_LITERAL = re.compile(r"^[-+−]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?$")
_RELATION_SIGN = r"(?:=|\\approx|<|>|\\le|\\ge|\\leq|\\geq|\\lt|\\gt|\\sim|\\ne|\\neq)"
_RELATION = re.compile(_RELATION_SIGN + r"\s*[-−]?\s*$")
# A relation followed by a list of values, up to the literal at the end: "d_k = 1, \dots, " before the 5.
_LIST_AFTER_RELATION = re.compile(
    _RELATION_SIGN + r"\s*[-−]?\s*(?:\d+(?:\.\d+)?\s*,\s*(?:\\[lc]?dots\s*,\s*)?)+[-−]?\s*$"
)
# What a value is given to, when it is a single symbol: "d_k", "\rho", "T", "\sigma_q", "s_{ij}" (not "e^0").
_SYMBOL = re.compile(r"^(?:\\[A-Za-z]+|[A-Za-z])(?:_(?:\{[^{}]*\}|\\?\w))?$")
# "=" and then values, up to the literal: a value given, not a condition ("T > 0") or an estimate ("J \approx 0").
_GIVEN_EQUAL = re.compile(r"(?<![<>!\\])=\s*(?:[-−]?\s*\d+(?:\.\d+)?\s*,\s*(?:\\[lc]?dots\s*,\s*)?)*[-−]?\s*$")
# What may follow a value standing alone: the end of the formula, a comma, a relation, a spacing command.
_VALUE_END = re.compile(r"^\s*(?:$|\\\)|,|\.|;|=|\\quad|\\qquad|\\text)")
_LEFT_SIDE = re.compile(r"(?:^|" + _RELATION_SIGN + r"|[,;(\[]|\\quad|\\qquad|\\text\{[^}]*\})\s*([^=<>,;(\[]*?)\s*"
                        + _RELATION_SIGN + r"[^=<>]*$")
# Numbering that refers to the book's own structure, typed or linked.
_NUMBERING = re.compile(r"\b(?:Exercises?|Chapters?|Sections?|Figures?|Fig\.|Tables?|Equations?|Eq\.)\s+\d+(?:\.\d+)*")
_LEADING_NUMBER = re.compile(r"^\s*\d+(?:\.\d+)*\.?\s")
# TeX that a reader would see verbatim: a control word, math delimiters, or braced sub/superscripts.
_RAW_TEX = re.compile(r"\\[A-Za-z]+|\\[()\[\]]|\$|[_^]\{")
# A file name or path: "../_images/x.png", "/abs/path", "x.svg", or a long hex hash ("key/value" is fine).
_PATH_LIKE = re.compile(
    r"(?:^|\s)(?:\.{1,2}/|/|_images/)|\S\.(?:png|svg|jpe?g|gif|webp)\b|\b[0-9a-f]{16,}\b", re.IGNORECASE
)


def _soup(html, article_only=False):
    """The parsed page; only its ``<article>`` (the content, without the theme's chrome) when `article_only`."""
    bs4 = require("bs4")
    only = bs4.SoupStrainer("article") if article_only else None
    return bs4.BeautifulSoup(html, "html.parser", parse_only=only)


def _missing_site():
    if IN_CI:
        pytest.fail(f"the built book is required in CI: {SITE} has no index.html (run make docs)")
    pytest.skip(f"no built book at {SITE} (run make docs)")


def _pages():
    if not (SITE / "index.html").is_file():
        return []
    pages = (path.relative_to(SITE).as_posix() for path in SITE.rglob("*.html"))
    return sorted(page for page in pages if not page.startswith(NOT_PAGES))


PAGES = _pages()
PROSE_PAGES = [page for page in PAGES if not page.startswith(NOT_PROSE)] or ["index.html"]


def _page_name(page):
    """``chapters/03_softmax.html`` -> ``chapters/03_softmax`` (the source path, as the allow-list names it)."""
    return page.removesuffix(".html")


@functools.cache
def _read(page):
    path = SITE / page
    if not path.is_file():
        _missing_site()
    return path.read_text(encoding="utf-8")


# -- Typed numbers ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """A number found in a page's prose, with the words around it (or the TeX source of its formula)."""

    number: str
    context: str


def _sentence(text, start, end):
    """The sentence of ``text`` around ``text[start:end]``, at most about 200 characters."""
    left = max(text.rfind(". ", 0, start) + 2, start - 120, 0)
    if left > 0 and text[left - 1] != " ":  # cut at a word, not inside one
        left = text.find(" ", left, start) + 1 or left
    right = text.find(". ", end)
    right = len(text) if right < 0 else min(right + 1, end + 120)
    return text[left:right].strip()


def prose_numbers(html):
    """Every number in a page's prose that did not come from a glue, as `Number` records, in page order."""
    soup = _soup(html, article_only=True)
    article = soup.select_one("article.bd-article") or soup.body or soup
    # Alt text is prose a reader hears, wherever its image is: it takes the place of the image, or of the cell
    # output or glued figure that holds it (which goes below).
    not_prose = "div.cell, div.output, pre, span.pasted-text, span.pasted-inline, div.pasted-inline"
    removed = {id(element) for element in article.select(not_prose)}
    for img in article.select("img[alt]"):
        holders = [parent for parent in img.parents if id(parent) in removed]
        alt = soup.new_string(f" {img['alt'].strip().rstrip('.')}. ")
        (holders[-1] if holders else img).insert_before(alt)
        img.decompose()
    for element in article.select(not_prose):
        element.decompose()
    found = []
    # Inline code left in the prose: literals beyond notation (as in math below), then out of the text.
    for code in article.select("code"):
        snippet = " ".join(code.get_text().split())
        if _ONE_LITERAL.match(snippet) and not code.find_parent(["td", "th"]):
            code.replace_with(" ")  # the name of a constant, as ``-1e9``
            continue
        for match in _CODE_LITERAL.finditer(snippet):
            literal = match.group()
            beyond = len(re.sub(r"\D", "", literal)) > 1 or "." in literal or "e" in literal.lower()
            if beyond and float(literal) not in (0.0, 1.0) and not _CODE_EXPONENT.search(snippet[: match.start()]):
                found.append(Number(literal, snippet))
        code.replace_with(" ")
    for element in article.select(
        "span.section-number, span.caption-number, a.headerlink, span.eqno, div.toctree-wrapper, "
        ".reading-time, .reading-paths, "  # computed by docs/_ext/reading_time.py, as a glue is
        'a[href*="references.html#"]'
    ):
        element.decompose()
    # Math (and out of the text): TeX literals beyond notation.
    for math in article.select("span.math, div.math"):
        tex = " ".join(math.get_text().split())
        found += [Number(literal, tex) for literal in math_data(tex, inline=math.name == "span")]
        math.replace_with(" ")
    # Numbering in headings and in links to other pages ("4. Why divide ...") is structure, not a result.
    for element in article.select("h1, h2, h3, h4, h5, h6, a.reference.internal, p.admonition-title"):
        for string in element.find_all(string=True, limit=1):
            string.replace_with(_LEADING_NUMBER.sub(" ", str(string)))
    text = " ".join(article.get_text(" ").split())
    text = _NUMBERING.sub(" ", text)
    hits = [*_PROSE_NUMBER.finditer(text), *_NUMBER_WORD.finditer(text), *_ORDINAL.finditer(text),
            *_MULTIPLE_WORD.finditer(text)]
    for match in sorted(hits, key=lambda m: m.start()):
        found.append(Number(match.group(), _sentence(text, match.start(), match.end())))
    return found


def math_data(tex, inline=True):
    """The literals of the formula `tex` that are data, not notation (the rule in the module docstring)."""
    data = []
    for match in _MATH_LITERAL.finditer(tex):
        literal, before = match.group(), tex[: match.start()]
        digits = re.sub(r"\D", "", literal)
        given = _RELATION.search(before) is not None or _LIST_AFTER_RELATION.search(before) is not None
        if len(digits) > 1 or "." in literal or (given and digits not in {"0", "1"}):
            data.append(literal)
        elif inline and _GIVEN_EQUAL.search(before) and _VALUE_END.match(tex[match.end():]):
            # 0 or 1 set equal to a single symbol, as its whole value: "d_k = 1", "\rho = 1", "d_k = 1, \dots";
            # not a condition ("T > 0"), an identity ("e^0 = 1") or a formula's start ("\tau = 1/\sqrt{E}").
            left = _LEFT_SIDE.search(before.removeprefix("\\(").strip())
            if left and _SYMBOL.match(left.group(1).strip()):
                data.append(literal)
    return data


def _allowed():
    entries = tomllib.loads(ALLOWED.read_text(encoding="utf-8")).get("allow", [])
    for entry in entries:
        missing = {"page", "number", "context", "check"} - set(entry)
        assert not missing, f"{ALLOWED.name}: entry {entry} lacks {sorted(missing)}"
        assert entry["number"] in entry["context"], f"{ALLOWED.name}: {entry['number']!r} not in its context {entry}"
    return entries


def _unexplained(page, numbers, entries):
    """The numbers of `page` that no allow-list entry covers, and the entries for `page` that cover nothing."""
    name = _page_name(page)
    mine = [entry for entry in entries if entry["page"] == name]
    used = set()
    unexplained = []
    for found in numbers:
        context = " ".join(found.context.split())
        matches = [i for i, entry in enumerate(mine) if entry["number"] == found.number and entry["context"] in context]
        if matches:
            used.update(matches)
        else:
            unexplained.append(found)
    unused = [entry for i, entry in enumerate(mine) if i not in used]
    return unexplained, unused


def _report(page, unexplained, unused):
    lines = [f"{page}: a number typed into the prose; glue it from the code, or list it in {ALLOWED.name}:"]
    lines += [f"  {found.number!r} in: {found.context}" for found in unexplained]
    if unused:
        lines.append(f"{page}: entries of {ALLOWED.name} that match nothing on the page (remove them):")
        lines += [f"  {entry['number']!r} in: {entry['context']}" for entry in unused]
    return "\n".join(lines)


@pytest.mark.parametrize("page", PROSE_PAGES)
def test_prose_numbers_come_from_the_code(page):
    unexplained, unused = _unexplained(page, prose_numbers(_read(page)), _allowed())
    assert not unexplained and not unused, _report(page, unexplained, unused)


def test_allow_list_names_only_pages_of_the_book():
    if not PAGES:
        _missing_site()
    names = {_page_name(page) for page in PROSE_PAGES}
    strangers = sorted({entry["page"] for entry in _allowed()} - names)
    assert not strangers, f"{ALLOWED.name} names pages the book does not have: {strangers}"


# -- Raw TeX where nothing typesets it ---------------------------------------------------------------------------


def raw_tex_in_titles(html):
    """Texts a reader sees untypeset that hold TeX: the browser title and every navigation or link text."""
    soup = _soup(html)
    texts = [("browser title", soup.title.get_text() if soup.title else "")]
    for link in soup.select("nav a, a.reference.internal, a.prev-page, a.next-page, .prev-next-title"):
        if link.select_one("span.math"):  # MathJax typesets it in place (on every page: see docs/conf.py)
            continue
        texts.append(("link text", " ".join(link.get_text(" ").split())))
    return [(where, text) for where, text in texts if _RAW_TEX.search(text)]


def raw_tex_in_search_index(text):
    """Titles in Sphinx's ``searchindex.js`` that hold TeX (the search page shows them as they are)."""
    index = json.loads(text[text.index("(") + 1 : text.rindex(")")])
    titles = [*index.get("titles", []), *index.get("alltitles", {})]
    return sorted({title for title in titles if _RAW_TEX.search(title)})


@pytest.mark.parametrize("page", PAGES or ["index.html"])
def test_no_raw_tex_in_titles_and_links(page):
    found = raw_tex_in_titles(_read(page))
    assert not found, f"{page}: raw TeX a reader sees untypeset: {found}"


def test_no_raw_tex_in_search_titles_or_notebook_names():
    if not PAGES:
        _missing_site()
    assert raw_tex_in_search_index(_read("searchindex.js")) == []
    names = [path.name for path in (SITE / "_sources").rglob("*.ipynb")]
    assert names, "no downloadable notebooks found"
    assert [name for name in names if _RAW_TEX.search(name)] == []


# -- Alt text ----------------------------------------------------------------------------------------------------


def figure_alt_texts(html):
    """``(src, alt)`` of every image in a page's content (``alt`` is None when missing)."""
    soup = _soup(html, article_only=True)
    article = soup.select_one("article.bd-article") or soup.body or soup
    return [(img.get("src", ""), img.get("alt")) for img in article.select("img")]


def alt_text_problems(pages_and_images):
    """What is wrong with the alt texts of ``{page: [(src, alt), ...]}``: missing, short, path-like, repeated."""
    problems, seen = [], {}
    for page, images in pages_and_images.items():
        for src, alt in images:
            alt = " ".join((alt or "").split())
            if not alt:
                problems.append(f"{page}: {src} has no alt text")
            elif _PATH_LIKE.search(alt):
                problems.append(f"{page}: {src} has a file name for alt text: {alt!r}")
            elif len(alt.split()) < 6:
                problems.append(f"{page}: {src} has too short an alt text to say what it shows: {alt!r}")
            elif alt in seen and seen[alt][1] != src:
                problems.append(f"{page}: {src} repeats the alt text of {seen[alt][1]} on {seen[alt][0]}: {alt!r}")
            else:
                seen.setdefault(alt, (page, src))
    return problems


@functools.cache
def _all_alt_texts():
    if not PAGES:
        _missing_site()
    return {page: figure_alt_texts(_read(page)) for page in PAGES}


def test_every_figure_has_its_own_alt_text():
    images = _all_alt_texts()
    assert sum(map(len, images.values())) >= 20, "expected the book's figures"
    assert alt_text_problems(images) == []


# -- Exercise labels ---------------------------------------------------------------------------------------------


def exercise_labels(sources):
    """{label: [page, ...]} of the exercises in `sources` ({page: MyST text}), e.g. {"4.1": ["chapters/04_scaling"]}."""
    found = {}
    for page, text in sources.items():
        for label in re.findall(r"^:::+\{admonition\} Exercise (\S+)\s*$", text, re.MULTILINE):
            found.setdefault(label, []).append(page)
    return found


def test_every_exercise_label_names_one_exercise():
    docs = ROOT / "docs"
    sources = {path.relative_to(docs).with_suffix("").as_posix(): path.read_text(encoding="utf-8")
               for path in docs.rglob("*.md") if "_build" not in path.parts}
    labels = exercise_labels(sources)
    assert len(labels) >= 40, sorted(labels)
    assert {label: pages for label, pages in labels.items() if len(pages) > 1} == {}
    # ... and the check can fail: a second page reusing a label.
    doubled = exercise_labels({**sources, "copy": ":::{admonition} Exercise 4.1\nAgain.\n:::\n"})
    assert doubled["4.1"] == ["chapters/04_scaling", "copy"]


# -- The checks can fail: each one on a deliberately broken copy of a real page ---------------------------------


def _chapter_with_figures():
    images = _all_alt_texts()
    chapters = [page for page in PROSE_PAGES if page.startswith("chapters/") and images.get(page)]
    if not chapters:
        _missing_site()
    return chapters[0]


def test_selftest_a_typed_number_is_caught():
    page = _chapter_with_figures()
    html = _read(page)
    entries = _allowed()
    broken = html.replace("</article>", "<p>The largest error was 0.0042 in float32.</p></article>", 1)
    unexplained, _ = _unexplained(page, prose_numbers(broken), entries)
    assert [found.number for found in unexplained][-1:] == ["0.0042"], unexplained
    assert "The largest error was 0.0042 in float32." in unexplained[-1].context
    in_math = html.replace("</article>", r'<p><span class="math">\(d_k = 1024\)</span></p></article>', 1)
    assert any(found.number == "1024" and "d_k = 1024" in found.context for found in prose_numbers(in_math))
    # Data in math: a value given to a symbol (0 and 1 too, inline), a list after a relation; not an identity.
    for tex, numbers in [
        (r"\(d_k = 1\)", ["1"]),
        (r"\(\rho = 1\)", ["1"]),
        (r"\(d_k = 1, \dots, 5\)", ["1", "5"]),
        (r"\(\sum_j \alpha_j = 1\)", []),
        (r"\(\mathcal{N}(0, \rho^2)\)", []),
    ]:
        typed = html.replace("</article>", f'<p>With <span class="math">{tex}</span> here.</p></article>', 1)
        found = [f for f in prose_numbers(typed) if f.context == tex]
        assert [f.number for f in found] == numbers, (tex, found)
    derivation = html.replace("</article>", r'<div class="math">\[\mathbb{E}[q] = 0 = 1 - 1\]</div></article>', 1)
    assert prose_numbers(derivation) == prose_numbers(html)  # display math's 0 and 1 are notation
    # Alt text, wherever its image is: a cell's output as well as a glued figure.
    for holder in ('<div class="cell"><div class="cell_output">{}</div></div>', "<figure>{}</figure>"):
        img = '<img src="x.png" alt="Bars of the weights of 32 keys, head size 64">'
        typed = html.replace("</article>", holder.format(img) + "</article>", 1)
        found = [f.number for f in prose_numbers(typed) if "head size 64" in f.context]
        assert found == ["32", "64"], (holder, found)
    spelled = html.replace("</article>", "<p>It fell over five decades.</p></article>", 1)
    assert "five" in [found.number for found in prose_numbers(spelled)]
    # The gaps closed: ordinals, multiples, and literals in inline code.
    for typed, number in [
        ("It agrees to the 7th significant digit.", "7th"),
        ("The cache takes twice the memory.", "twice"),
        ("Use <code>atol=1e-5</code> for float32.", "1e-5"),
        ("The tolerance is <code>atol=0.002</code> here.", "0.002"),
        ("A shape of <code>(2, 16, 64)</code>.", "64"),
        ("<table><tr><td><code>2e-3</code></td></tr></table>", "2e-3"),
    ]:
        found = [f.number for f in prose_numbers(html.replace("</article>", f"<p>{typed}</p></article>", 1))]
        assert found.count(number) > [f.number for f in prose_numbers(html)].count(number), typed
    # ... and what stays notation or a name: half precision, an axis, a dtype.
    names = html.replace(
        "</article>",
        "<p>In half precision, <code>axis=-1</code> of a <code>float16</code> array, <code>scale=0.0</code>,"
        " <code>d ** -0.5</code>, a constant <code>-1e9</code>.</p></article>",
        1,
    )
    assert prose_numbers(names) == prose_numbers(html)
    # What is not prose stays out: a glued value, a code cell, notation, numbering.
    fine = html.replace(
        "</article>",
        '<p>Error <span class="pasted-text">0.0042</span>, see Exercise 3.2, shape'
        r' <span class="math">\(n^2 + x_1\)</span>.</p>'
        '<div class="cell"><pre>x = 12345</pre></div></article>',
        1,
    )
    assert prose_numbers(fine) == prose_numbers(html)


def test_selftest_an_unused_allow_list_entry_is_caught():
    page = _chapter_with_figures()
    stale = [{"page": _page_name(page), "number": "31337", "context": "31337 nowhere", "check": "none"}]
    assert _unexplained(page, prose_numbers(_read(page)), stale)[1] == stale


def test_selftest_a_tex_title_is_caught():
    page = _chapter_with_figures()
    html = _read(page)
    broken = re.sub(r"<title>", r"<title>4. Why divide by \\(\\sqrt{d_k}\\) ", html, count=1)
    where, text = raw_tex_in_titles(broken)[0]
    assert where == "browser title" and "\\sqrt{d_k}" in text, (where, text)
    link_html = '<a class="reference internal" href="#">4. Why divide by \\sqrt{d_k}</a></article>'
    link = html.replace("</article>", link_html)
    assert ("link text", "4. Why divide by \\sqrt{d_k}") in raw_tex_in_titles(link)
    index = 'Search.setIndex({"titles": ["4. Why divide by \\\\(\\\\sqrt{d_k}\\\\)"], "alltitles": {}})'
    assert raw_tex_in_search_index(index) == ["4. Why divide by \\(\\sqrt{d_k}\\)"]


def test_selftest_a_path_or_repeated_alt_text_is_caught():
    page = _chapter_with_figures()
    src = figure_alt_texts(_read(page))[0][0]
    alt = "Line plot of the attention weight of each book against the temperature"
    assert alt_text_problems({page: [(src, alt)]}) == []
    path_alt = {page: [("../_images/1e57.png", "../_images/1e575f2afc1be46bd66229bd3d8b16c0.png")]}
    assert "file name" in " ".join(alt_text_problems(path_alt))
    assert "no alt text" in " ".join(alt_text_problems({page: [(src, None)]}))
    bare_hash = {page: [(src, "1e575f2afc1be46bd66229bd3d8b16c0a44365cfb9ee0a0580301f67b33d33cb")]}
    assert "file name" in " ".join(alt_text_problems(bare_hash))
    slash = "Heatmap of the key/value weights of each query, brighter where the weight is larger"
    assert alt_text_problems({page: [(src, slash)]}) == []
    repeated = {page: [(src, alt), ("../_images/other.png", alt)]}
    assert "repeats the alt text" in " ".join(alt_text_problems(repeated))

"""The book to keep: ``make pdf`` and ``make epub`` build, and the PDF reads as the site does.

Both are built once per test run (``books``, shared by pytest-xdist's workers through a lock file) from the
doctrees and execution cache of the main build (``make docs``, run before the tests by ``make test``), so no
chapter runs again. Every expectation is read from the main HTML build, never typed here: the page titles, the
glued numbers (MyST-NB's ``pasted-text`` spans) and the figure captions. Each check is a function returning what it
found wrong, and each has a test on a broken copy (a glued number dropped, a caption dropped, a figure removed from
the EPUB, a missing character in the log) that must report it.

Tools (Debian, installed by ``make tex``): TeX Live with latexmk and XeLaTeX, poppler-utils (pdftotext, pdftoppm,
pdfinfo), epubcheck and tesseract-ocr, which reads a rendered page as a person would.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import uuid
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import IN_CI, ext_module

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "docs" / "_build"
MAIN = BUILD / "html"
PDF = BUILD / "latex" / "attention_ref.pdf"
LATEX_LOG = BUILD / "latex" / "attention_ref.log"
EPUB = BUILD / "epub" / "attention_ref.epub"
TOOLS = ("make", "latexmk", "xelatex", "pdftotext", "pdftoppm", "pdfinfo", "epubcheck", "java", "tesseract")
WARNING_LINE = re.compile(r"\bWARNING\b|\w+Warning: |^make.*Error")

pytestmark = pytest.mark.docs

# A run of pytest-xdist gives all its workers one id; a plain run gets its own.
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


def _need(condition, reason):
    if not condition:
        if IN_CI:
            pytest.fail(f"required in CI: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def books():
    """Build the PDF and the EPUB once per test run; the build's exit status and output, as a dict."""
    _need((MAIN / "index.html").is_file(), f"the main build {MAIN} (make docs)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    _need(not missing, f"{', '.join(missing)} not installed (make tex)")
    record = BUILD / "print-build.json"
    with open(BUILD / "print-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker builds; the others wait and read its record
        if record.is_file() and json.loads(record.read_text()).get("run") == RUN_ID:
            return json.loads(record.read_text())
        result = subprocess.run(
            ["make", "--no-print-directory", "pdf", "epub"], cwd=ROOT, capture_output=True, text=True, timeout=1800,
            env={**os.environ, "NO_COLOR": "1"},
        )
        built = {"run": RUN_ID, "returncode": result.returncode, "output": result.stdout + result.stderr}
        record.write_text(json.dumps(built))
        return built


# -- Reading the HTML build ---------------------------------------------------------------------------------


class _Collect(HTMLParser):
    """The text of the first <h1>, of every ``pasted-text`` span, paragraph, admonition title and <figcaption>
    outside the explorable figures (math as MathJax source, between ``\\(`` and ``\\)``)."""

    def __init__(self):
        super().__init__()
        self.title, self.glued, self.captions, self.paragraphs, self.admonitions = None, [], [], [], []
        self.glued_in = []  # for each of `paragraphs`, the pasted-text spans inside it
        self._stack = []  # (tag, kind, text parts)
        self._spans: dict[int, list[str]] = {}  # id(parts) of an open paragraph -> its pasted-text spans so far

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag in {"a"} and "headerlink" in classes:
            kind = "skip"
        elif tag == "h1" and self.title is None:
            kind = "title"
        elif tag == "span" and "pasted-text" in classes:
            kind = "glued"
        elif tag == "figure" and "explorable" in classes:
            kind = "explorable"
        elif tag == "figcaption" and any(k == "explorable" for _, k, _ in self._stack):
            # An explorable figure (docs/_ext/explorables/) is its still image in print, titled inside the image.
            kind = "explorable caption"
        elif tag == "figcaption":
            kind = "caption"
        elif tag == "p" and "admonition-title" in classes:
            kind = "admonition"
        elif tag == "p":
            kind = "paragraph"
        else:
            kind = None
        if tag in {"br", "img", "meta", "link", "input", "hr"}:
            return
        self._stack.append((tag, kind, []))

    def handle_endtag(self, tag):
        while self._stack:
            open_tag, kind, parts = self._stack.pop()
            text = " ".join("".join(parts).split())
            if kind == "title":
                self.title = text
            elif kind == "glued":
                self.glued.append(text)
                inside = next((p for _, k, p in reversed(self._stack) if k == "paragraph"), None)
                if inside is not None:
                    self._spans.setdefault(id(inside), []).append(text)
            elif kind == "caption":
                self.captions.append(text)
            elif kind == "paragraph":
                self.paragraphs.append(text)
                self.glued_in.append(self._spans.pop(id(parts), []))
            elif kind == "admonition":
                self.admonitions.append(text)
            if kind != "skip" and self._stack:
                self._stack[-1][2].append("".join(parts))
            if open_tag == tag:
                return

    def handle_data(self, data):
        if self._stack:
            self._stack[-1][2].append(data)


def html_page(docname):
    parser = _Collect()
    parser.feed((MAIN / f"{docname}.html").read_text(encoding="utf-8"))
    return parser


def book_order():
    """Every page of the book in reading order: the landing page, then each toctree's pages."""
    reading_time = ext_module("reading_time")
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    return ["index"] + [name for _, names in reading_time.parts(index) for name in names]


# -- Reading the PDF ----------------------------------------------------------------------------------------


def pdf_pages(pdf):
    """The text of each page of `pdf` (pdftotext; pages are separated by form feeds)."""
    text = subprocess.run(["pdftotext", "-enc", "UTF-8", str(pdf), "-"], capture_output=True, text=True, check=True)
    return text.stdout.split("\f")


def squeeze(text):
    """`text` without what line breaking changes: whitespace, hyphens, and the math markers of the HTML."""
    text = text.replace("\\(", "").replace("\\)", "")
    return re.sub(r"[\s\-\u00ad\u2010\u2011]+", "", text)


def missing_titles(pages, titles):
    """The titles (but the first, the book's own) not found in the PDF's body in that order."""
    body = squeeze("".join(pages))
    # The table of contents lists every page but the landing page, whose title is the book's: the body starts
    # after the contents' last entry.
    missing, position = [], body.find(squeeze(titles[-1]))
    for title in titles[1:]:
        found = body.find(squeeze(title), position + 1)
        if found < 0:
            missing.append(title)
        else:
            position = found
    return missing


def missing_text(pages, snippets):
    """The snippets (glued numbers, captions) that no page of the PDF holds."""
    body = squeeze("".join(pages))
    return [snippet for snippet in snippets if squeeze(snippet) not in body]


def caption_words(caption):
    """The caption's text outside math, in pieces: math is typeset in the PDF, its TeX source is not."""
    return [piece.strip() for piece in re.split(r"\\\(.*?\\\)", caption) if len(piece.strip()) > 3]


def letters(text):
    """The letters and digits of `text`: pdftotext may set a typeset symbol (a root sign) inside a caption's line."""
    return re.sub(r"[^0-9A-Za-z]+", "", text)


def missing_captions(pages, pieces):
    """The caption pieces whose letters and digits no page of the PDF holds in that order."""
    body = letters("".join(pages))
    return [piece for piece in pieces if letters(piece) not in body]


def glued_paragraphs(docname):
    """The paragraphs of a page that hold glued numbers (at least two pasted-text spans with digits)."""
    page = html_page(docname)
    return [
        paragraph for paragraph, spans in zip(page.paragraphs, page.glued_in, strict=True)
        if sum(bool(re.search(r"\d", glued)) for glued in spans) >= 2
    ]


NUMBER = re.compile(r"−?-?\d+(?:[.,]\d+)*(?:e[+-]?\d+)?%?")


def ocr_page(pdf, page_number, tmp_path):
    """The text a person would read on one page of `pdf`: pdftoppm renders it, tesseract reads it."""
    stem = tmp_path / f"page{page_number}"
    subprocess.run(["pdftoppm", "-r", "200", "-gray", "-png", "-singlefile", "-f", str(page_number), "-l",
                    str(page_number), str(pdf), str(stem)], check=True, timeout=120)
    ocr = subprocess.run(["tesseract", f"{stem}.png", "-", "--psm", "3"], capture_output=True, text=True,
                         check=True, timeout=300)
    return ocr.stdout


def numbers_not_on_page(pages, paragraph, read_page):
    """The numbers of an HTML `paragraph` that the rendered PDF page holding it does not show."""
    words = paragraph.split()
    opening = squeeze(" ".join(words[:6]))
    number = next((n for n, text in enumerate(pages, 1) if opening in squeeze(text)), None)
    if number is None:
        return [f"no page starts the paragraph {paragraph[:60]!r}"]
    seen = squeeze(read_page(number) + read_page(number + 1)).replace("−", "-")  # it may run onto the next page
    return [n for n in NUMBER.findall(paragraph) if squeeze(n).replace("−", "-") not in seen]


def epubcheck(epub):
    """Run epubcheck on `epub`. Debian installs it as a jar linked from /usr/bin, which only runs directly where
    the kernel hands jars to Java (binfmt_misc): here it is run with ``java -jar``."""
    program = Path(shutil.which("epubcheck")).resolve()
    command = ["java", "-jar", str(program)] if program.suffix == ".jar" else [str(program)]
    return subprocess.run([*command, "-q", str(epub)], capture_output=True, text=True, timeout=600)


# -- The builds -------------------------------------------------------------------------------------------


def test_both_formats_build_without_warnings(books):
    warnings = [line for line in books["output"].splitlines() if WARNING_LINE.search(line)]
    assert books["returncode"] == 0, books["output"][-4000:]
    assert warnings == []
    assert PDF.stat().st_size > 100_000 and EPUB.stat().st_size > 100_000


def test_the_latex_log_reports_no_missing_character_reference_or_overfull_line(books):
    latex_log = ext_module("_latex_log")
    log = LATEX_LOG.read_text(encoding="utf-8", errors="replace")
    assert "Output written on attention_ref.pdf" in log
    assert latex_log.problems(log, LATEX_LOG.with_suffix(".tex").read_text(encoding="utf-8")) == []


def test_the_log_check_reports_what_the_page_would_show_wrong():
    latex_log = ext_module("_latex_log")
    tex = "\\sphinxAtStartPar\nSome text.\n\\end{tabulary}\n"
    clean = (
        "Overfull \\hbox (1.2pt too wide) in paragraph at lines 1--2\n"
        "Overfull \\hbox (12.5pt too wide) in paragraph at lines 3--3\n"  # a table cell, into the column gap
    )
    assert latex_log.problems(clean, tex) == []
    broken = {
        "Missing character: There is no \u27f6 (U+27F6) in font DejaVu Serif/OT:script=latn;!",
        "LaTeX Warning: Reference `chapters/05_masks:masks' on page 3 undefined on input line 7.",
        "LaTeX Warning: Citation `vaswani2017' on page 4 undefined on input line 9.",
        "Overfull \\hbox (12.5pt too wide) in paragraph at lines 1--2",  # body text
        "Overfull \\hbox (25.0pt too wide) in paragraph at lines 3--3",  # a table cell past the column gap
    }
    assert set(latex_log.problems(clean + "\n".join(sorted(broken)) + "\n", tex)) == broken


def test_epubcheck_reports_no_errors(books):
    result = epubcheck(EPUB)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not re.search(r"^(ERROR|FATAL)", result.stdout + result.stderr, re.MULTILINE)


def test_epubcheck_reports_a_figure_removed_from_the_epub(books, tmp_path):
    broken = tmp_path / "broken.epub"
    with zipfile.ZipFile(EPUB) as good, zipfile.ZipFile(broken, "w") as bad:
        figures = [info for info in good.infolist() if info.filename.endswith(".png")]
        assert figures, "the EPUB has no PNG figure"
        for info in good.infolist():
            if info.filename != figures[0].filename:
                kind = zipfile.ZIP_STORED if info.filename == "mimetype" else zipfile.ZIP_DEFLATED
                bad.writestr(info, good.read(info), compress_type=kind)
    result = epubcheck(broken)
    assert result.returncode != 0
    assert Path(figures[0].filename).name in result.stdout + result.stderr


def test_the_epub_holds_every_page_in_reading_order(books):
    with zipfile.ZipFile(EPUB) as book:
        opf = book.read(next(name for name in book.namelist() if name.endswith(".opf"))).decode()
    manifest = dict(re.findall(r'<item id="([^"]+)" href="([^"]+)\.xhtml"', opf))
    spine = [manifest[ref] for ref in re.findall(r'<itemref idref="([^"]+)"', opf) if ref in manifest]
    order = book_order()
    assert [name for name in spine if name in order] == order


def test_no_glued_number_can_break_at_its_hyphen(books):
    """The EPUB's glued numbers carry non-breaking hyphens; the PDF's sit in an unbreakable box."""
    with zipfile.ZipFile(EPUB) as book:
        pages = [book.read(name).decode() for name in book.namelist() if name.endswith(".xhtml")]
    number = re.compile(r"<span class=\"[^\"]*glued-number[^\"]*\">(.*?)</span>")
    numbers = [span for page in pages for span in number.findall(page)]
    assert len(numbers) > 20 and all("\u2011" in span and "-" not in span for span in numbers)
    tex = (BUILD / "latex" / "attention_ref.tex").read_text()
    assert re.search(r"\\DUrole\{glued-number\}\{[^}]*\\sphinxhyphen", tex)  # hyphenated numbers boxed ...
    style = (BUILD / "latex" / "attention_ref.sty").read_text()
    assert "\\csname DUroleglued-number\\endcsname#1{\\mbox{#1}}" in style  # ... as an unbreakable box


# -- The PDF reads as the site ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pages(books):
    return pdf_pages(PDF)


def test_the_pdf_has_every_page_title_in_reading_order(pages):
    titles = [html_page(name).title for name in book_order()]
    assert all(titles), titles
    assert missing_titles(pages, titles) == []
    # A broken copy: a chapter's title gone from the PDF.
    assert titles[5] in missing_titles([squeeze(page).replace(squeeze(titles[5]), "") for page in pages], titles)


def test_the_pdf_has_the_worked_examples_glued_numbers(pages):
    glued = html_page("chapters/worked_example").glued
    assert len(glued) >= 20, glued
    assert missing_text(pages, glued) == []
    # A broken copy: one glued number dropped.
    dropped = next(g for g in glued if re.search(r"\d\.\d{3}", g))
    broken = [page.replace(dropped, "") for page in pages]
    assert missing_text(broken, [dropped]) == [dropped]


def test_the_pdf_has_every_figure_caption(pages):
    captions = [caption for name in book_order() for caption in html_page(name).captions]
    assert len(captions) >= 10, captions
    pieces = [piece for caption in captions for piece in caption_words(caption)]
    assert missing_captions(pages, pieces) == []
    # A broken copy: the page with the first figure and its caption missing.
    broken = [page for page in pages if letters(pieces[0]) not in letters(page)]
    assert len(broken) < len(pages)
    assert pieces[0] in missing_captions(broken, pieces)


def test_every_exercise_has_its_solution_marked_in_the_pdf(pages):
    titles = [title for name in book_order() for title in html_page(name).admonitions]
    exercises = [title for title in titles if title.startswith("Exercise ")]
    assert len(exercises) >= 20, exercises
    assert missing_text(pages, [f"Solution to {exercise}" for exercise in exercises]) == []
    # Nothing that only the site can do is named: the toggles MyST-NB puts on hidden cells.
    assert not re.search(r"(Show|Hide) code cell", "".join(pages))


@pytest.mark.parametrize("docname", ["chapters/worked_example", "chapters/05_masks"])
def test_a_rendered_page_shows_the_sites_numbers(pages, docname, tmp_path):
    """pdftoppm renders the page holding the first paragraph of glued numbers, tesseract reads it: every number
    the HTML paragraph holds is on it."""
    paragraphs = glued_paragraphs(docname)
    assert paragraphs, f"{docname} has no paragraph with glued numbers"
    paragraph = paragraphs[0]
    cache = {}

    def read_page(number):
        if number not in cache:
            cache[number] = ocr_page(PDF, number, tmp_path) if number <= len(pages) else ""
        return cache[number]

    assert NUMBER.findall(paragraph), paragraph
    assert numbers_not_on_page(pages, paragraph, read_page) == []
    # A broken copy: the paragraph with a number that the page does not show (its last: the opening words,
    # which find the page, stay as they are).
    last = list(NUMBER.finditer(paragraph))[-1]
    wrong = paragraph[: last.start()] + "987.654" + paragraph[last.end() :]
    assert numbers_not_on_page(pages, wrong, read_page) == ["987.654"]

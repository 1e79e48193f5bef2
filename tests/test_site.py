"""The built book, read the way people read it: in Chromium, offline, in the theme's light and dark modes.

These tests serve ``docs/_build/html`` (made by ``make docs``; ``make test`` builds it first) on 127.0.0.1 and
drive Debian's Chromium through Playwright. Every page is loaded in both colour modes and must

* pass axe-core's WCAG 2.0/2.1/2.2 level A and AA rules with zero violations,
* request nothing from any host but the local server, and get no response with status >= 400,
* log no console error and raise no page error,
* render every formula with the self-hosted MathJax, without a TeX error.

Further tests check that figures stay readable on the dark page, that every chapter can be reached from the
landing page, that previous/next links follow the table of contents, that search finds chapters, and that each
chapter offers its executed notebook for download as a valid ``.ipynb``.

Without a built site or without ``/usr/bin/chromium`` the tests skip locally and fail in CI (``CI=true``).
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import re
import threading
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from conftest import IN_CI, require

ROOT = Path(__file__).resolve().parents[1]
# BOOK_SITE points the tests at another build folder (a helper's scratch build, say).
SITE = Path(os.environ.get("BOOK_SITE", ROOT / "docs" / "_build" / "html"))
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
MODES = ("light", "dark")
WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]
# Folders of the build that hold assets and downloads, not pages.
NOT_PAGES = {"_static", "_images", "_sources", "_downloads", "_modules", "reports"}

pytestmark = pytest.mark.browser


def _missing(what):
    if IN_CI:
        pytest.fail(f"{what} is required in CI")
    pytest.skip(f"{what} is missing")


def _site_pages():
    """Every HTML page of the build, as paths relative to its root (``chapters/03_softmax.html``)."""
    if not SITE.is_dir():
        return []
    return sorted(
        path.relative_to(SITE).as_posix()
        for path in SITE.rglob("*.html")
        if not NOT_PAGES & set(path.relative_to(SITE).parts[:-1])
    )


PAGES = _site_pages() or ["index.html"]
CHAPTERS = [page for page in PAGES if page.startswith("chapters/")] or ["chapters/missing.html"]


# -- Fixtures: the local server and the browser -----------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def guess_type(self, path):
        return "application/json" if str(path).endswith(".ipynb") else super().guess_type(path)

    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="session")
def site():
    """Base URL of the built book served on 127.0.0.1 (a free port, one thread per request)."""
    if not (SITE / "index.html").is_file():
        _missing(f"the built book ({SITE}; run `make docs`)")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def browser():
    sync_api = require("playwright.sync_api")
    if not CHROMIUM.is_file():
        _missing(f"{CHROMIUM} (apt-get install chromium, or `make chromium`)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Visit:
    """One page opened in a fresh browser context, with everything that happened on the way recorded."""

    def __init__(self, browser, url, mode):
        self.mode = mode
        self.foreign = []  # requests to any host but the local server (blocked)
        self.bad_responses = []  # responses with status >= 400
        self.failed = []  # requests that failed for another reason
        self.errors = []  # console errors and uncaught page errors
        self.context = browser.new_context(
            color_scheme="light" if mode == "auto" else mode,
            viewport={"width": 1280, "height": 900},
            service_workers="block",
        )
        # pydata-sphinx-theme reads the colour mode from localStorage before the first paint ("auto": a first
        # visit, nothing stored, the system's light scheme).
        if mode != "auto":
            self.context.add_init_script(
                f"localStorage.setItem('mode', '{mode}'); localStorage.setItem('theme', '{mode}');"
            )
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc} {exc.stack}"))
        self.page.on("response", lambda r: r.status >= 400 and self.bad_responses.append(f"{r.status} {r.url}"))
        self.page.on("requestfailed", self._request_failed)
        self.page.goto(url, wait_until="load")
        self.math_count = self._wait_for_math()

    def _console(self, message):
        if message.type in ("error", "warning"):
            self.errors.append(f"console {message.type}: {message.text}")

    def _route(self, route):
        if urlsplit(route.request.url).hostname in LOCAL_HOSTS or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            self.foreign.append(route.request.url)
            route.abort("blockedbyclient")

    def _request_failed(self, request):
        if request.url not in self.foreign:
            self.failed.append(f"{request.failure} {request.url}")

    def _wait_for_math(self):
        """Number of formulas on the page, after MathJax (if the page has any) has typeset them all."""
        count = self.page.locator(".math").count()
        if count:
            self.page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
            self.page.evaluate("() => MathJax.startup.promise")
        return count

    def close(self):
        self.context.close()


@pytest.fixture
def visit(browser, site):
    opened = []

    def open_page(page, mode="light"):
        opened.append(Visit(browser, urljoin(site, page), mode))
        return opened[-1]

    yield open_page
    for each in opened:
        each.close()


# -- Every page, in both modes ----------------------------------------------------------------------------------


def _axe_violations(page):
    axe = require("axe_playwright_python.base")
    page.evaluate(axe.AXE_SCRIPT)
    options = {"runOnly": {"type": "tag", "values": WCAG_TAGS}, "resultTypes": ["violations"]}
    results = page.evaluate("options => axe.run(document, options)", options)
    return [
        f"{v['id']} ({v['impact']}): {v['help']}\n"
        + "\n".join(f"    {node['target']}: {node['failureSummary']}" for node in v["nodes"][:5])
        for v in results["violations"]
    ]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("page_path", PAGES)
def test_page_is_accessible_offline_and_error_free(visit, page_path, mode):
    seen = visit(page_path, mode)
    page = seen.page
    assert page.evaluate("document.documentElement.dataset.theme") == mode
    # What the reader's page load did (before axe runs: axe itself fetches style sheets to inspect them).
    assert seen.foreign == [], "requests left the machine"
    assert seen.bad_responses == [] and seen.failed == [], seen.bad_responses + seen.failed
    assert seen.errors == []
    violations = _axe_violations(page)
    assert violations == [], f"{len(violations)} axe violations on {page_path} ({mode}):\n" + "\n".join(violations)
    assert page.locator("link[rel~='icon']").count() >= 1, "no favicon link"
    if seen.math_count:
        untypeset = page.locator(".math:not(:has(mjx-container))").count()
        assert untypeset == 0, f"{untypeset} of {seen.math_count} formulas were not typeset"
        errors = page.locator("mjx-merror").all_text_contents()
        assert errors == [], f"TeX errors: {errors}"


def test_first_visit_is_error_free(visit):
    # A reader's first visit: no colour mode stored yet, the theme follows the system (light here).
    seen = visit("index.html", "auto")
    assert seen.page.evaluate("document.documentElement.dataset.theme") == "light"
    assert seen.errors == [] and seen.bad_responses == [] and seen.foreign == []


def test_some_chapter_has_typeset_math(visit):
    seen = visit("chapters/03_softmax.html" if "chapters/03_softmax.html" in PAGES else CHAPTERS[0])
    assert seen.math_count > 0
    assert seen.page.locator("mjx-container").count() >= seen.math_count
    # Self-hosted: the MathJax script comes from the book's own _static folder.
    sources = seen.page.eval_on_selector_all("script[src*='mathjax' i]", "els => els.map(e => e.src)")
    assert sources and all(urlsplit(src).hostname in LOCAL_HOSTS for src in sources), sources


def test_favicon_is_served(visit, site):
    seen = visit("index.html")
    href = seen.page.eval_on_selector("link[rel~='icon']", "el => el.href")
    response = seen.page.request.get(href)
    assert response.status == 200, href
    assert response.headers["content-type"].startswith("image/"), response.headers
    assert len(response.body()) > 0


def test_external_requests_are_caught(visit, site):
    # The offline check can fail: a page that asks for a remote resource gets it recorded (and blocked).
    seen = visit("index.html")
    seen.page.evaluate("() => fetch('https://example.org/x.js').catch(() => null)")
    seen.page.wait_for_timeout(200)
    assert seen.foreign == ["https://example.org/x.js"]


# -- Figures ------------------------------------------------------------------------------------------------------

_NATURAL_EDGE = """
img => {
  const canvas = document.createElement('canvas');
  canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
  const ctx = canvas.getContext('2d');
  ctx.drawImage(img, 0, 0);
  const {data} = ctx.getImageData(0, 0, canvas.width, canvas.height);
  const w = canvas.width, h = canvas.height, ring = 2, out = [];
  for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
    if (x >= ring && x < w - ring && y >= ring && y < h - ring) continue;
    const i = 4 * (y * w + x);
    out.push([data[i], data[i + 1], data[i + 2], data[i + 3]]);
  }
  return out;
}
"""


def _luminance(rgb):
    """WCAG relative luminance of an sRGB colour given as 0-255 integers."""

    def linear(c):
        c = c / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _contrast(l1, l2):
    return (max(l1, l2) + 0.05) / (min(l1, l2) + 0.05)


def _ring(image, inset, width):
    """Pixels of the rectangular ring ``width`` wide, ``inset`` pixels inside the border of a PIL image."""
    w, h = image.size
    pixels = image.load()
    return [
        pixels[x, y]
        for y in range(inset, h - inset)
        for x in range(inset, w - inset)
        if min(x - inset, y - inset, w - 1 - inset - x, h - 1 - inset - y) < width
    ]


def _mean_luminance(pixels):
    return sum(_luminance(p) for p in pixels) / len(pixels)


FIGURES = "article img:not(.only-light):not(.only-dark)"
MARGIN = 6  # CSS pixels of page around a figure in its screenshot


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_figures_are_readable_in_dark_mode(visit, chapter):
    image_module = require("PIL.Image")
    seen = visit(chapter, "dark")
    page = seen.page
    page_background = _luminance(
        [int(c) for c in re.findall(r"\d+", page.evaluate("getComputedStyle(document.body).backgroundColor"))]
    )
    assert page_background < 0.05, "the dark page is not dark"
    problems = []
    for index, img in enumerate(page.locator(FIGURES).all()):
        name = f"figure {index + 1} ({img.get_attribute('src')})"
        img.scroll_into_view_if_needed()
        if not img.is_visible():  # inside a folded (hidden) solution cell
            continue
        # 1. The figure itself has an opaque, light background: its own pixels at the border.
        edge = img.evaluate(_NATURAL_EDGE)
        transparent = sum(p[3] < 255 for p in edge)
        dark = sum(_luminance(p) < 0.8 for p in edge)
        if transparent or dark > len(edge) // 100:
            problems.append(f"{name}: border has {transparent} transparent and {dark} dark of {len(edge)} pixels")
            continue
        natural = _mean_luminance(edge)
        # 2. On the dark page the figure is shown as it is (not dimmed or inverted by the theme) and stands out
        #    from the page with at least the 3:1 contrast WCAG asks of graphics (1.4.11).
        box = img.bounding_box()
        shot = image_module.open(
            io.BytesIO(
                page.screenshot(
                    clip={
                        "x": box["x"] - MARGIN,
                        "y": box["y"] - MARGIN,
                        "width": box["width"] + 2 * MARGIN,
                        "height": box["height"] + 2 * MARGIN,
                    }
                )
            )
        ).convert("RGB")
        scale = shot.size[0] / (box["width"] + 2 * MARGIN)
        # The theme may frame the figure (padding, border): the drawing itself starts inside that frame.
        frame = img.evaluate(
            "e => { const s = getComputedStyle(e);"
            " return Math.max(...['Top', 'Right', 'Bottom', 'Left'].map("
            "   side => parseFloat(s['padding' + side]) + parseFloat(s['border' + side + 'Width']))); }"
        )
        shown = _mean_luminance(_ring(shot, round((MARGIN + frame + 3) * scale), 2))
        outline = _mean_luminance(_ring(shot, round((MARGIN + 1) * scale), 2))
        if abs(shown - natural) > 0.05:
            problems.append(f"{name}: shown with luminance {shown:.2f} on the dark page, drawn with {natural:.2f}")
        if _contrast(outline, page_background) < 3:
            problems.append(f"{name}: contrast {_contrast(outline, page_background):.1f}:1 against the dark page")
    assert problems == [], "\n".join(problems)


def test_the_book_has_figures():
    if not SITE.is_dir():
        _missing(f"the built book ({SITE})")
    with_figures = [page for page in CHAPTERS if "<img" in (SITE / page).read_text()]
    assert len(with_figures) >= len(CHAPTERS) // 2, with_figures


# -- Navigation -------------------------------------------------------------------------------------------------


def _local_links(page, site):
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    links = set()
    for href in hrefs:
        url = href.split("#")[0].split("?")[0]
        if url.startswith(site) and url.endswith(".html"):
            links.add(url[len(site):])
    return links


def test_every_page_is_reachable_from_the_landing_page(visit, site):
    seen = visit("index.html")
    page = seen.page
    reached, frontier = {"index.html"}, ["index.html"]
    while frontier:
        current = frontier.pop()
        if current != "index.html":
            page.goto(urljoin(site, current), wait_until="domcontentloaded")
        for link in _local_links(page, site) - reached:
            if (SITE / link).is_file():
                reached.add(link)
                frontier.append(link)
    assert set(CHAPTERS) <= reached, sorted(set(CHAPTERS) - reached)
    unreachable = set(PAGES) - reached - {"genindex.html", "search.html", "py-modindex.html"}
    assert unreachable == set(), sorted(unreachable)


def _toctree_order():
    """Chapter pages in the order docs/index.md's toctrees list them."""
    text = (ROOT / "docs" / "index.md").read_text()
    entries = []
    for block in re.findall(r"```\{toctree\}(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith(":"):
                target = re.sub(r".*<(.*)>$", r"\1", line)  # "Title <path>" form
                entries.append(target.removesuffix(".md") + ".html")
    return [entry for entry in entries if entry.startswith("chapters/")]


def test_previous_and_next_links_follow_the_table_of_contents(visit, site):
    expected = _toctree_order()
    assert set(expected) == set(CHAPTERS), "index.md's toctree and the built chapters differ"
    seen = visit("index.html")
    page = seen.page
    chain, current = ["index.html"], "index.html"
    while True:
        nxt = page.locator("a.right-next")
        if not nxt.count():
            break
        target = urlsplit(nxt.first.get_attribute("href")).path
        following = urlsplit(urljoin(urljoin(site, current), target)).path.lstrip("/")
        assert following not in chain, f"next links loop at {following}"
        page.goto(urljoin(site, following), wait_until="domcontentloaded")
        previous = page.locator("a.left-prev")
        assert previous.count(), f"{following} has no previous link"
        back = urlsplit(urljoin(urljoin(site, following), previous.first.get_attribute("href"))).path.lstrip("/")
        assert back == current, f"{following}: previous is {back}, expected {current}"
        chain.append(following)
        current = following
    chapters_in_chain = [page_path for page_path in chain if page_path.startswith("chapters/")]
    assert chapters_in_chain == expected


def _distinctive_word(chapter):
    """The longest word of a chapter's title: something a reader would search for."""
    title = (SITE / chapter).read_text()
    match = re.search(r"<h1>(.*?)<a class=\"headerlink\"", title, re.DOTALL)
    assert match, f"no title in {chapter}"
    words = re.findall(r"[A-Za-z]{4,}", re.sub(r"<[^>]+>", " ", match.group(1)))
    assert words, match.group(1)
    return max(words, key=len)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_search_finds_the_chapter(visit, chapter):
    word = _distinctive_word(chapter)
    seen = visit(f"search.html?q={word}")
    page = seen.page
    page.wait_for_function(
        "() => /finished|did not match/i.test(document.querySelector('#search-results')?.textContent || '')"
    )
    found = {urlsplit(href).path.lstrip("/") for href in page.eval_on_selector_all(
        "#search-results ul.search li a", "els => els.map(e => e.href)")}
    assert chapter in found, f"searching for {word!r} found {sorted(found)}"
    assert seen.errors == []


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_offers_its_notebook(visit, chapter):
    nbformat = require("nbformat")
    seen = visit(chapter)
    links = seen.page.eval_on_selector_all("a[href$='.ipynb']", "els => els.map(e => e.href)")
    assert links, "no .ipynb download link"
    response = seen.page.request.get(links[0])
    assert response.status == 200, links[0]
    notebook = nbformat.reads(response.text(), as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count for cell in code), "the notebook is not the executed one"
    assert any(cell.outputs for cell in code)
    assert json.loads(response.text())["metadata"]["kernelspec"]["name"] == "python3"

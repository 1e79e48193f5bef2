"""The built book, read the way people read it: in Chromium, offline, in the theme's light and dark modes.

These tests serve ``docs/_build/html`` (made by ``make docs``; ``make test`` builds it first) on 127.0.0.1 and
drive Debian's Chromium through Playwright. Every page is loaded once and checked in both colour modes (light
as stored before the first paint, then dark through the theme's own switch); it must

* pass axe-core's WCAG 2.0/2.1/2.2 level A and AA rules with zero violations in each mode,
* request nothing from any host but the local server, and get no response with status >= 400,
* log no console error and raise no page error,
* render every formula with the self-hosted MathJax, without a TeX error,
* show its figures on the dark page as drawn (not dimmed or inverted), standing out from the page.

Further tests show that these checks can fail, that every chapter can be reached from the landing page, that
previous/next links follow the table of contents, that search finds chapters, and that each chapter offers its
executed notebook for download as a valid ``.ipynb``.

Without a built site or without ``/usr/bin/chromium`` the tests skip locally and fail in CI (``CI=true``).
"""

from __future__ import annotations

import contextlib
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
from conftest import IN_CI, ext_module, require

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
    """Every HTML page of the build, as paths relative to its root (``chapters/03_softmax.html``).

    Chapters first: they take the longest to check, and the tests run in this order (see tests/conftest.py).
    """
    if not SITE.is_dir():
        return []
    pages = (path.relative_to(SITE).as_posix() for path in SITE.rglob("*.html"))
    return sorted(
        (page for page in pages if not NOT_PAGES & set(page.split("/")[:-1])),
        key=lambda page: (not page.startswith("chapters/"), page),
    )


PAGES = _site_pages() or ["index.html"]
CHAPTERS = [page for page in PAGES if page.startswith("chapters/")] or ["chapters/missing.html"]


# -- Fixtures: the local server and the browser -----------------------------------------------------------------


# axe-core, served beside the book at a path no page uses, so that the browser caches it (and its compiled code)
# like any script instead of parsing half a megabyte of source on every page.
AXE_PATH = "/__axe-core__/axe.min.js"


class AxeBesideTheSite:
    """Mixin for a handler of the site: axe-core's script served at ``AXE_PATH`` too, for the axe checks."""

    def translate_path(self, path):
        if path == AXE_PATH:
            return str(Path(require("axe_playwright_python").__file__).with_name("axe.min.js"))
        return super().translate_path(path)


def _static_handler():
    """The book's static handler (docs/_ext/_live_server.py, as `make serve` serves the site), with axe-core."""
    return type("Handler", (AxeBesideTheSite, ext_module("_live_server").StaticHandler), {})


@pytest.fixture(scope="session")
def site():
    """Base URL of the built book served on 127.0.0.1 (a free port, one thread per request)."""
    if not (SITE / "index.html").is_file():
        _missing(f"the built book ({SITE}; run `make docs`)")
    handler = functools.partial(_static_handler(), directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def launch_chromium():
    """Debian's Chromium through Playwright, offline. The ``browser`` fixture (tests/conftest.py) holds one per
    test process, shared by every module that drives it: Playwright's sync API runs one instance per thread."""
    sync_api = require("playwright.sync_api")
    if not CHROMIUM.is_file():
        _missing(f"{CHROMIUM} (apt-get install chromium, or `make chromium`)")
    with sync_api.sync_playwright() as playwright:
        # Offline for real: every request to a host but this machine goes to a proxy that does not exist and fails.
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            proxy={"server": DEAD_PROXY, "bypass": "127.0.0.1,localhost"},
        )
        yield chromium
        chromium.close()


# Requests to anything but the local server (or data:/blob: URLs). They are recorded from the browser's request
# events; the browser's proxy (DEAD_PROXY, a closed port) makes them fail. (Playwright's request routing would
# block them too, but it turns off the browser's HTTP cache: every page would fetch and compile its scripts anew.)
FOREIGN_URL = re.compile(r"^(?!(https?://(127\.0\.0\.1|localhost)(:\d+)?/|data:|blob:))")
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there


class Visit:
    """A browser tab in its own context, recording what happens while it opens pages.

    ``Visit(browser, url, mode)`` opens `url` in a fresh context (nothing cached, nothing stored); `open`
    loads another page in the same tab, with the browser's cache warm, and starts a new record.
    """

    def __init__(self, browser, url, mode):
        self.mode = mode
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
        self.page = self.context.new_page()
        self.page.on("request", self._request)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc} {exc.stack}"))
        self.page.on("response", lambda r: r.status >= 400 and self.bad_responses.append(f"{r.status} {r.url}"))
        self.page.on("requestfailed", self._request_failed)
        self.open(url)

    def open(self, url):
        """Load `url` in this tab (until the load event and typeset math), recording afresh."""
        self.foreign = []  # requests to any host but the local server (they fail at the dead proxy)
        self.bad_responses = []  # responses with status >= 400
        self.failed = []  # requests that failed for another reason
        self.errors = []  # console errors and uncaught page errors
        self.page.goto(url, wait_until="load")
        self.math_count = self._wait_for_math()
        return self

    def _console(self, message):
        if message.type in ("error", "warning"):
            self.errors.append(f"console {message.type}: {message.text}")

    def _request(self, request):
        if FOREIGN_URL.match(request.url):
            self.foreign.append(request.url)

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


@pytest.fixture(scope="session")
def tab(browser, site):
    """This worker's one light-mode tab (the landing page first), shared by the tests that need no fresh browser:
    the cache stays warm between pages, and `Visit.open` starts each page's record afresh."""
    seen = Visit(browser, urljoin(site, "index.html"), "light")
    yield seen
    seen.close()


# -- Every page, in both modes ----------------------------------------------------------------------------------


# Syntax highlighting wraps every token of a code cell in a <span> whose colour comes from its class: thousands
# of them on a chapter, and axe's colour-contrast rule checks each one (most of a chapter's axe time). Spans
# are presentational (no role, no name, no id), so merging the repeats of one kind into plain text changes
# nothing any other rule sees, and the rule still checks one span of every kind: same class, same colours,
# same parent and same kind of block (input or output cell).
_MERGE_REPEATED_CODE_SPANS = """() => {
  const seen = new Set(), repeats = [];
  for (const span of document.querySelectorAll('div.highlight pre span')) {
    const block = span.closest('div.highlight'), style = getComputedStyle(span);
    const kind = [span.className, style.color, style.backgroundColor, span.parentElement.className,
                  block.className, block.parentElement.className].join('|');
    if (seen.has(kind)) repeats.push(span); else seen.add(kind);
  }
  for (const span of repeats) span.replaceWith(span.textContent);  // read everything first, then write
  return {merged: repeats.length, kept: seen.size};
}"""


# Only the violations cross over to Python: the passes and the rest would be serialised and never read.
_AXE_RUN = "options => axe.run(document, options).then(results => results.violations)"


def _axe_violations(page, rules=None):
    """axe-core's WCAG A/AA violations on the page as it is now, as (rule id, report) pairs (only `rules`, if given)."""
    if not page.evaluate("() => typeof axe !== 'undefined'"):
        page.add_script_tag(url=urljoin(page.url, AXE_PATH))
    only = {"type": "rule", "values": rules} if rules else {"type": "tag", "values": WCAG_TAGS}
    options = {"runOnly": only, "resultTypes": ["violations"], "selectors": False}
    violations = page.evaluate(_AXE_RUN, options)
    if violations:  # again with CSS selectors for the report (skipping them saves ~15% per run)
        violations = page.evaluate(_AXE_RUN, {**options, "selectors": True})
    return [
        (
            v["id"],
            f"{v['id']} ({v['impact']}): {v['help']}\n"
            + "\n".join(f"    {node['target']}: {node['failureSummary']}" for node in v["nodes"][:5]),
        )
        for v in violations
    ]


def _switch_mode(page, mode):
    """Switch the colour mode the way a reader does: the theme's own light/dark/auto button."""
    page.evaluate(f"() => document.querySelector('.theme-change-button[data-mode={mode}]').click()")
    # The theme fades some colours (CSS transitions): axe must see the end state, not a frame in between, so
    # the fades are finished at once (the state a reader sees a moment later).
    page.evaluate(_SETTLE)
    return page.evaluate("document.documentElement.dataset.theme")


_SETTLE = """async () => {
  for (let i = 0; i < 2; i++) await new Promise(requestAnimationFrame);  // the new styles start their transitions
  const finite = document.getAnimations().filter(a => a.effect?.getComputedTiming().endTime !== Infinity);
  for (const a of finite) try { a.finish(); } catch (e) { /* already gone */ }
  await Promise.all(finite.map(a => a.finished.catch(() => null)));
}"""


def _axe_in_each_mode(seen, rules=None):
    """{mode: violations} for a page opened in light mode, switched to each mode in turn by the theme's button."""
    page = seen.page
    page.evaluate(_MERGE_REPEATED_CODE_SPANS)
    found = {}
    for mode in MODES:
        if page.evaluate("document.documentElement.dataset.theme") != mode:
            # (axe's own fetches of style sheets may log 404s for @import paths: only the switch is judged)
            before = len(seen.errors), len(seen.bad_responses), len(seen.foreign)
            assert _switch_mode(page, mode) == mode, f"the theme's switch did not turn on {mode} mode"
            after = seen.errors[before[0]:] + seen.bad_responses[before[1]:] + seen.foreign[before[2]:]
            assert after == [], f"switching to {mode} mode: {after}"
        found[mode] = _axe_violations(page, rules)
    return found


@pytest.mark.parametrize("page_path", PAGES)
def test_page_is_accessible_offline_and_error_free(tab, site, page_path):
    # One load per page: first in light mode (stored before the first paint, as on a return visit), then in
    # dark mode through the theme's switch. A reader's tab, so assets come from the cache after the first page;
    # a first visit with nothing cached is test_first_visit_is_error_free.
    seen = tab.open(urljoin(site, page_path))
    page = seen.page
    assert page.evaluate("document.documentElement.dataset.theme") == "light"
    # What the reader's page load did (before axe runs: axe itself fetches style sheets to inspect them).
    assert seen.foreign == [], "requests left the machine"
    assert seen.bad_responses == [] and seen.failed == [], seen.bad_responses + seen.failed
    assert seen.errors == []
    assert page.locator("link[rel~='icon']").count() >= 1, "no favicon link"
    if seen.math_count:
        untypeset = page.locator(".math:not(:has(mjx-container))").count()
        assert untypeset == 0, f"{untypeset} of {seen.math_count} formulas were not typeset"
        errors = page.locator("mjx-merror").all_text_contents()
        assert errors == [], f"TeX errors: {errors}"
    problems = [
        f"{len(violations)} axe violations on {page_path} ({mode}):\n" + "\n".join(report for _, report in violations)
        for mode, violations in _axe_in_each_mode(seen).items()
        if violations
    ]
    # Now in dark mode: the figures must stay readable (see _dark_figure_problems).
    problems += _dark_figure_problems(page)
    assert problems == [], "\n".join(problems)


def test_the_checks_see_code_colours_dark_mode_and_figures(tab, site):
    # The checks above can fail: a keyword colour unreadable on the light code background (one span of
    # thousands, after merging) and paragraph text unreadable only on the dark page are both reported.
    # (Contrast near 1:1 would not do: axe files that as possibly hidden text, "incomplete", not a violation.)
    seen = tab.open(urljoin(site, CHAPTERS[0]))  # the styles added below are gone with the next page
    assert seen.page.locator("div.highlight pre span.k").count() > 1
    seen.page.add_style_tag(
        content=".highlight span.k { color: #b4b4b4 !important; }"
        " html[data-theme=dark] article p { color: #5a5a5a !important; }"
    )
    found = _axe_in_each_mode(seen, rules=["color-contrast"])  # the faults are colours: the one rule they break
    light = [report for rule, report in found["light"] if rule == "color-contrast"]
    dark = [report for rule, report in found["dark"] if rule == "color-contrast"]
    assert light and ".k" in light[0] and "> p" not in light[0], found["light"]
    assert dark and "p" in dark[0], found["dark"]
    # And a theme that inverted figures on the dark page would be caught.
    assert _dark_figure_problems(seen.page) == []
    seen.page.add_style_tag(content="html[data-theme=dark] article img { filter: invert(1) !important; }")
    inverted = _dark_figure_problems(seen.page)
    assert any("shown with luminance" in problem for problem in inverted), inverted


def test_first_visit_is_error_free(visit):
    # A reader's first visit: no colour mode stored yet, the theme follows the system (light here).
    seen = visit("index.html", "auto")
    assert seen.page.evaluate("document.documentElement.dataset.theme") == "light"
    assert seen.errors == [] and seen.bad_responses == [] and seen.foreign == []


def test_some_chapter_has_typeset_math(tab, site):
    seen = tab.open(urljoin(site, "chapters/03_softmax.html" if "chapters/03_softmax.html" in PAGES else CHAPTERS[0]))
    assert seen.math_count > 0
    assert seen.page.locator("mjx-container").count() >= seen.math_count
    # Self-hosted: the MathJax script comes from the book's own _static folder.
    sources = seen.page.eval_on_selector_all("script[src*='mathjax' i]", "els => els.map(e => e.src)")
    assert sources and all(urlsplit(src).hostname in LOCAL_HOSTS for src in sources), sources


def test_math_renders_from_the_pruned_mathjax(visit):
    """A first visit (nothing cached) to a page with math: every MathJax file it requests is served, the formulas
    are typeset by the CommonHTML output with its fonts, and what MathJax fetches later on the reader's demand
    (a TeX package through \\require, the menu's SVG renderer and accessibility explorer) loads too. See
    docs/_ext/mathjax_prune.py, which removes the rest of MathJax from the site."""
    page = "chapters/03_softmax.html" if "chapters/03_softmax.html" in PAGES else CHAPTERS[0]
    seen = visit(page)
    requested = []
    seen.page.on("request", lambda request: "/_static/mathjax/" in request.url and requested.append(request.url))
    seen.open(seen.page.url)  # again, now recording MathJax's requests (the cache is warm only for the page)
    assert seen.math_count > 0
    assert seen.page.locator("mjx-container[jax='CHTML']").count() >= seen.math_count
    assert seen.page.locator("mjx-merror").count() == 0
    fonts = seen.page.evaluate(
        "() => document.fonts.ready.then(() => [...document.fonts].filter(f => f.family.startsWith('MJXTEX'))"
        ".map(f => f.family + ' ' + f.status))")
    assert fonts and any(font.endswith(" loaded") for font in fonts), fonts
    assert all(not font.endswith(" error") for font in fonts), fonts
    loaded = seen.page.evaluate("""async () => {
        const math = await MathJax.tex2chtmlPromise('\\\\require{cancel}\\\\cancel{x}');
        await MathJax.loader.load('output/svg', 'a11y/explorer');
        return [math.querySelector('mjx-merror') === null, !!MathJax._.output.svg_ts, !!MathJax._.a11y.explorer_ts];
    }""")
    assert loaded == [True, True, True], loaded
    assert requested, "no MathJax file was requested"
    assert seen.bad_responses == [] and seen.failed == [] and seen.errors == [], (
        seen.bad_responses + seen.failed + seen.errors)


def test_favicon_is_served(tab, site):
    seen = tab.open(urljoin(site, "index.html"))
    href = seen.page.eval_on_selector("link[rel~='icon']", "el => el.href")
    response = seen.page.request.get(href)
    assert response.status == 200, href
    assert response.headers["content-type"].startswith("image/"), response.headers
    assert len(response.body()) > 0


def test_external_requests_are_caught(tab, site):
    # The offline check can fail: a page that asks for a remote resource gets it recorded, and the request fails
    # in the browser (a remote host given by address as well as by name).
    seen = tab.open(urljoin(site, "index.html"))
    for url in ("https://example.org/x.js", "http://192.0.2.1/y.js"):  # 192.0.2.0/24: TEST-NET-1, never routed
        outcome = seen.page.evaluate("url => fetch(url).then(() => 'loaded', () => 'failed')", url)
        assert outcome == "failed", url
    assert seen.foreign == ["https://example.org/x.js", "http://192.0.2.1/y.js"]


# -- Figures ------------------------------------------------------------------------------------------------------

def _natural_edge(page, img, image_module):
    """The image file's own pixels (RGBA) in a ring 2 pixels wide along its border, as the server sends it."""
    response = page.request.get(img.evaluate("e => e.currentSrc || e.src"))
    assert response.status == 200, response.url
    return _ring(image_module.open(io.BytesIO(response.body())).convert("RGBA"), 0, 2)


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
    import numpy as np

    inner = np.asarray(image)[inset : image.size[1] - inset, inset : image.size[0] - inset]
    h, w = inner.shape[:2]
    rows, cols = np.arange(h)[:, None], np.arange(w)[None, :]
    near_edge = np.minimum(np.minimum(rows, h - 1 - rows), np.minimum(cols, w - 1 - cols)) < width
    return [tuple(int(c) for c in pixel) for pixel in inner[near_edge]]


def _mean_luminance(pixels):
    return sum(_luminance(p) for p in pixels) / len(pixels)


FIGURES = "article img:not(.only-light):not(.only-dark)"
MARGIN = 6  # CSS pixels of page around a figure in its screenshot


def _dark_figure_problems(page):
    """What makes a figure hard to read on the page, which is in dark mode ([] when every figure is fine)."""
    image_module = require("PIL.Image")
    page_background = _luminance(
        [int(c) for c in re.findall(r"\d+", page.evaluate("getComputedStyle(document.body).backgroundColor"))]
    )
    assert page_background < 0.05, "the dark page is not dark"
    problems = []
    for index, img in enumerate(page.locator(FIGURES).all()):
        name = f"figure {index + 1} ({img.get_attribute('src')})"
        if not img.is_visible():  # inside a folded (hidden) solution cell
            continue
        # In the middle of the window: flush with its edge, the margin of the screenshot below would fall outside.
        img.evaluate("e => e.scrollIntoView({block: 'center'})")
        # 1. The figure itself has an opaque, light background: its own pixels at the border.
        edge = _natural_edge(page, img, image_module)
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
    return problems


def test_the_book_has_figures():
    if not SITE.is_dir():
        _missing(f"the built book ({SITE})")
    with_figures = [page for page in CHAPTERS if "<img" in (SITE / page).read_text()]
    assert len(with_figures) >= len(CHAPTERS) // 2, with_figures


# -- Navigation -------------------------------------------------------------------------------------------------


# The navigation tests read many pages' links. Rendering each page costs about a second (scripts, fonts,
# MathJax); a reader's browser parsing the served HTML (fetch + DOMParser, no scripts run) sees the same
# server-rendered links, sidebar and previous/next included, in a few milliseconds.
_LINKS_OF = """async url => {
  const html = await (await fetch(url)).text();
  const doc = new DOMParser().parseFromString(html, 'text/html');
  const base = document.createElement('base'); base.href = url; doc.head.prepend(base);
  const hrefs = sel => [...doc.querySelectorAll(sel)].map(a => a.href);
  return {all: hrefs('a[href]'), next: hrefs('a.right-next'), prev: hrefs('a.left-prev'),
          notebooks: hrefs("a[href$='.ipynb']")};
}"""


def _links(page, site, url):
    """Links of the page at `url` as site-relative paths: {"all": set, "next": [..], "prev": [..]}."""
    found = page.evaluate(_LINKS_OF, url)

    def local(href):
        href = href.split("#")[0].split("?")[0]
        return href[len(site):] if href.startswith(site) and href.endswith(".html") else None

    return {
        "all": {path for path in map(local, found["all"]) if path},
        "next": [local(h) for h in found["next"]],
        "prev": [local(h) for h in found["prev"]],
        "notebooks": found["notebooks"],
    }


def test_every_page_is_reachable_from_the_landing_page(tab, site):
    page = tab.page
    reached, frontier = {"index.html"}, ["index.html"]
    while frontier:
        current = frontier.pop()
        for link in _links(page, site, urljoin(site, current))["all"] - reached:
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


def test_previous_and_next_links_follow_the_table_of_contents(tab, site):
    expected = _toctree_order()
    assert set(expected) == set(CHAPTERS), "index.md's toctree and the built chapters differ"
    page = tab.page
    page.goto(urljoin(site, "index.html"), wait_until="domcontentloaded")
    # The rendered landing page has the same "next" link as its served HTML.
    rendered_next = page.locator("a.right-next")
    assert rendered_next.count(), "the landing page has no next link"
    first = urlsplit(urljoin(site, rendered_next.first.get_attribute("href"))).path.lstrip("/")
    chain, current = ["index.html"], "index.html"
    while True:
        links = _links(page, site, urljoin(site, current))
        if current == "index.html":
            assert links["next"] == [first]
        if not links["next"]:
            break
        following = links["next"][0]
        assert following not in chain, f"next links loop at {following}"
        back = _links(page, site, urljoin(site, following))["prev"]
        assert back, f"{following} has no previous link"
        assert back[0] == current, f"{following}: previous is {back[0]}, expected {current}"
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
def test_search_finds_the_chapter(tab, site, chapter):
    word = _distinctive_word(chapter)
    seen = tab.open(urljoin(site, f"search.html?q={word}"))
    page = seen.page
    page.wait_for_function(
        "() => /finished|did not match/i.test(document.querySelector('#search-results')?.textContent || '')"
    )
    found = {urlsplit(href).path.lstrip("/") for href in page.eval_on_selector_all(
        "#search-results ul.search li a", "els => els.map(e => e.href)")}
    assert chapter in found, f"searching for {word!r} found {sorted(found)}"
    assert seen.errors == []


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_offers_its_notebook(tab, site, chapter):
    nbformat = require("nbformat")
    links = _links(tab.page, site, urljoin(site, chapter))["notebooks"]
    assert links, "no .ipynb download link"
    response = tab.page.request.get(links[0])
    assert response.status == 200, links[0]
    notebook = nbformat.reads(response.text(), as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count for cell in code), "the notebook is not the executed one"
    assert any(cell.outputs for cell in code)
    assert json.loads(response.text())["metadata"]["kernelspec"]["name"] == "python3"


# -- What the screen shows at 1280 px ---------------------------------------------------------------------------

# Every chapter page of the book (Part I, Part II, the landing page and the reference pages), read from the sources
# so that a new chapter is measured too. At the tab's 1280 px a code block holds 77 characters.
SCREEN_PAGES = [
    *(f"{name}.html" for name in ("index", "symbols", "notation", "faq", "glossary", "references")),
    *(f"chapters/{page.stem}.html" for page in sorted((ROOT / "docs" / "chapters").glob("*.md"))),
]

# What a reader sees on the page as it is now: build bookkeeping in shown code (glue calls), shown code lines
# wider than their block, display equations wider than the column, and search boxes on screen.
_SCREEN_MEASURES = """() => {
  // Shown: rendered and not inside a closed <details> (Chromium hides its content with content-visibility).
  const shown = e => e.checkVisibility({contentVisibilityAuto: true, visibilityProperty: true});
  const canvas = document.createElement('canvas').getContext('2d');
  const fits = pre => {  // how many characters of the block's monospace font fit on one line of it
    const style = getComputedStyle(pre);
    canvas.font = style.font;
    const room = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return Math.floor(room / (canvas.measureText('x'.repeat(100)).width / 100));
  };
  const code = [...document.querySelectorAll('div.cell_input pre')].filter(shown);
  const glue = [], wide = [];
  for (const pre of code) {
    const chars = fits(pre);
    for (const line of pre.textContent.split('\\n')) {
      if (/^\\s*glue\\(|\\bimport glue\\b/.test(line)) glue.push(line.trim());
      if ([...line].length > chars) wide.push(line);
    }
    if (pre.scrollWidth > pre.clientWidth + 1 && !wide.length) wide.push('(a block scrolls sideways)');
  }
  const right = document.querySelector('article.bd-article').getBoundingClientRect().right;
  const equations = [...document.querySelectorAll('mjx-container[display="true"]')].filter(shown).filter(c => {
    const box = (c.querySelector('mjx-math') || c).getBoundingClientRect();
    return box.right > right + 1 || box.width > c.getBoundingClientRect().width + 1;
  }).map(c => (c.closest('.math')?.textContent || '').trim().slice(0, 80));
  const search = [...document.querySelectorAll(
    'input[type="search"], .search-button-field, button.search-button, form.bd-search')].filter(shown);
  return {glue, wide, equations, search: search.length, charsPerLine: code.length ? fits(code[0]) : null};
}"""


def screen_measures(page):
    """The screen measures of the page open in `page` (a Playwright page)."""
    return page.evaluate(_SCREEN_MEASURES)


@pytest.mark.parametrize("page_path", SCREEN_PAGES)
def test_the_screen_shows_fitted_code_and_math_and_one_search_box(tab, site, page_path):
    if not (SITE / page_path).is_file():
        _missing(f"{page_path} in the built book")
    seen = tab.open(urljoin(site, page_path))
    measures = screen_measures(seen.page)
    assert measures["glue"] == [], f"build bookkeeping in shown code: {measures['glue']}"
    wide = measures["wide"]
    assert wide == [], f"{len(wide)} shown code lines wider than their block: {wide}"
    assert measures["equations"] == [], f"display equations wider than the column: {measures['equations']}"
    assert measures["search"] == 1, f"{measures['search']} search boxes on screen"


def test_selftest_the_screen_measures_see_each_problem(tab, site):
    seen = tab.open(urljoin(site, "chapters/04_scaling.html"))
    page = seen.page
    before = screen_measures(page)
    assert before["charsPerLine"] and 70 <= before["charsPerLine"] <= 90, before["charsPerLine"]
    page.evaluate("""() => {
      const pre = document.querySelector('div.cell_input pre');
      pre.textContent += '\\nglue("x", 1, display=False)\\n' + 'y = ' + '1 + '.repeat(40) + '1';
      const math = document.querySelector('mjx-container[display="true"] mjx-math');
      math.style.display = 'inline-block'; math.style.width = '3000px';
      const box = document.querySelector('.search-button-field');
      box.parentElement.append(box.cloneNode(true));
    }""")
    after = screen_measures(page)
    assert after["glue"] == [*before["glue"], 'glue("x", 1, display=False)']
    assert len(after["wide"]) == len(before["wide"]) + 1
    assert len(after["equations"]) == len(before["equations"]) + 1
    assert after["search"] == before["search"] + 1

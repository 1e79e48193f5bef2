"""Live code, as a reader uses it: the book served by ``make serve``'s code, in Chromium, with a real kernel.

The server is the one ``make serve`` runs (``docs/_ext/_live_server.py``), started here on free loopback ports
over the built site (``BOOK_SITE`` or ``docs/_build/html``). The browser is test_site's: offline (every request
to another host goes to a dead proxy and is recorded), with its axe checks in both colour modes. Also: the
kernel server refuses requests without the token or from another origin, a page with no kernel says why, Binder
is used when the build knows the repository, and the hosted configuration makes correct launch links.

``LIVE_TIMINGS`` (a file name) records the measured times: pressing "Live code" to ready, and Run on chapter
1's first cell to its end.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import ClassVar
from urllib.parse import urljoin

import pytest
from conftest import EXT, ext_module, require
from test_site import SITE, AxeBesideTheSite, Visit, _axe_in_each_mode, _missing

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "chapters/01_queries_keys_values.html"
READY = 180_000  # ms: a cold kernel on a busy 2-core machine


@pytest.fixture(scope="module")
def live():
    module = ext_module("_live_server", "jupyter_server")
    if not (SITE / CHAPTER).is_file():
        _missing(f"the built book ({SITE}; run `make docs`)")

    class Handler(AxeBesideTheSite, module.BookHandler):  # axe-core beside the book, as test_site serves it
        pass

    with module.LiveServer(SITE, handler=Handler) as server:
        yield server


def _cell(page, text):
    """The live cell whose source contains `text`."""
    cells = page.locator(".live-code-cell")
    for index in range(cells.count()):
        if text in cells.nth(index).locator("textarea").input_value():
            return cells.nth(index)
    raise AssertionError(f"no live cell contains {text!r}")


def _run(cell, timeout=60_000):
    """Press the cell's Run button and wait until it has finished; its output's text."""
    button = cell.get_by_role("button", name="Run", exact=True)
    if not button.is_visible():  # a folded cell (hide-input, hide-cell): unfold it as a reader would
        cell.locator("xpath=ancestor::details[1]/summary").click()
    button.click()
    cell.page.wait_for_function("c => c.dataset.state === 'done' || c.dataset.state === 'failed'",
                                arg=cell.element_handle(), timeout=timeout)
    return cell.locator(".live-code-output").inner_text()


def _run_up_to(page, text):
    """Run every cell from the top down to (and including) the one containing `text`; that cell."""
    cells = page.locator(".live-code-cell")
    for index in range(cells.count()):
        cell = cells.nth(index)
        _run(cell)
        assert not cell.locator(".live-code-error").count(), cell.locator(".live-code-output").inner_text()
        if text in cell.locator("textarea").input_value():
            return cell
    raise AssertionError(f"no live cell contains {text!r}")


def _record(name, seconds):
    print(f"{name}: {seconds:.2f} s")
    if os.environ.get("LIVE_TIMINGS"):
        path = Path(os.environ["LIVE_TIMINGS"])
        found = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps({**found, name: round(seconds, 3)}, indent=1))


@pytest.mark.browser
def test_a_reader_edits_and_runs_chapter_1(browser, live):
    seen = Visit(browser, urljoin(live.url, CHAPTER), "light")
    page = seen.page
    asked = []
    page.on("request", lambda request: asked.append(request.url))
    try:
        # Offline by default: the page loaded without asking the kernel server or its configuration anything.
        assert seen.foreign == [] and seen.errors == [] and seen.bad_responses == []
        button = page.get_by_role("button", name="Live code", exact=True)
        assert button.count() == 1
        assert not [url for url in asked if "_live/" in url or live.kernel_url in url]

        start = time.monotonic()
        button.click()
        status = page.get_by_role("status").filter(has_text="Live code")
        page.wait_for_function("() => ['ready', 'failed'].includes(attentionRefLiveCode.state)", timeout=READY)
        _record("live code pressed -> ready", time.monotonic() - start)
        assert page.evaluate("attentionRefLiveCode.state") == "ready", status.inner_text()
        assert button.get_attribute("aria-pressed") == "true"

        cells = page.locator(".live-code-cell")
        assert cells.count() >= 5
        start = time.monotonic()
        _run(cells.first)
        _record("run chapter 1's first cell -> done", time.monotonic() - start)

        # Change the softmax temperature and see the printed output change.
        soft = _run_up_to(page, "def soft_lookup")
        before = soft.locator(".live-code-output").inner_text()
        assert "array(" in before
        editor = soft.locator("textarea")
        source = editor.input_value()
        assert "temperature=1.0" in source
        editor.fill(source.replace("temperature=1.0", "temperature=0.05"))
        after = _run(soft)
        assert after != before and "array(" in after
        # A colder softmax puts (nearly) all the weight on the best book: the largest weight printed grows.
        weights = lambda text: [float(x) for x in text.split("array([")[-1].split("])")[0].split(",")]  # noqa: E731
        assert max(weights(after)) > max(weights(before)) > 0

        # Restore the cell (the later cells expect unit temperature), then draw the heatmap: a new figure.
        editor.fill(source)
        _run(soft)
        sources = [cells.nth(i).locator("textarea").input_value() for i in range(cells.count())]
        plot = None
        for index in range(sources.index(source) + 1, len(sources)):
            _run(cells.nth(index))
            if "plot_attention" in sources[index]:
                plot = cells.nth(index)
                break
        assert plot is not None, "no plotting cell ran"
        figure = plot.locator("img.live-code-figure")
        assert figure.count() == 1
        assert figure.get_attribute("src").startswith("data:image/png;base64,")
        assert figure.evaluate("img => img.complete && img.naturalWidth > 100")
        assert figure.get_attribute("alt")

        # A cell that raises shows its traceback.
        shelf = _cell(page, 'shelf["astronomy"]')
        editor = shelf.locator("textarea")
        editor.fill(editor.input_value().replace('shelf["astronomy"]', 'shelf["stargazing"]'))
        text = _run(shelf)
        assert "Traceback" in text and "KeyError" in text and "stargazing" in text, text

        # Keyboard: Shift+Enter in a cell runs it.
        shelf.locator("textarea").fill("print(len(shelf), 6 * 7)")
        shelf.locator("textarea").press("Shift+Enter")
        page.wait_for_function("c => c.dataset.state === 'done'", arg=shelf.element_handle())
        assert shelf.locator(".live-code-output").inner_text().strip() == "3 42"

        # With live code on and outputs shown, axe finds nothing in either colour mode.
        assert seen.errors == [], seen.errors
        found = _axe_in_each_mode(seen)
        assert found == {"light": [], "dark": []}, found
        seen.errors.clear()  # axe's own fetches of style sheets may log 404s for @import paths (see test_site)

        # Restart: the kernel forgets everything.
        page.get_by_role("button", name="Restart kernel").click()
        page.wait_for_function("() => /restarted/.test(document.querySelector('.live-code-status').textContent)",
                               timeout=READY)
        assert page.evaluate("attentionRefLiveCode.state") == "ready"
        assert "NameError" in _run(shelf)

        # Live code off again: the book's own cells and outputs are back.
        button.click()
        assert button.get_attribute("aria-pressed") == "false"
        assert page.locator(".cell_input").first.is_visible()
        assert seen.foreign == [], "requests left the machine"
        assert seen.errors == [], seen.errors
    finally:
        seen.close()


@pytest.mark.browser
def test_without_a_kernel_the_page_says_why(browser, live):
    seen = Visit(browser, urljoin(live.url, CHAPTER), "dark")
    try:
        seen.page.route("**/_live/config.json", lambda route: route.fulfill(status=404, body="not here"))
        seen.page.get_by_role("button", name="Live code", exact=True).click()
        seen.page.wait_for_function("() => attentionRefLiveCode.state === 'failed'")
        status = seen.page.locator(".live-code-status").inner_text()
        assert "No kernel" in status and "make serve" in status, status
        # A cell run says the same, in the cell.
        cell = seen.page.locator(".live-code-cell").first
        assert "No kernel" in _run(cell)
        assert seen.foreign == []
        found = _axe_in_each_mode(seen)
        assert found == {"light": [], "dark": []}, found
    finally:
        seen.close()


class _FakeBinder(http.server.BaseHTTPRequestHandler):
    """Binder's build API: an event stream ending in "ready" with a kernel server's address and token."""

    ready: ClassVar[dict] = {}
    asked: ClassVar[list] = []

    def do_GET(self):
        self.asked.append(self.path)
        events = [{"phase": "building", "message": "building"}, {"phase": "ready", **self.ready}]
        body = "".join(f"data: {json.dumps(event)}\n\n" for event in events).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


@pytest.mark.browser
def test_live_code_uses_binder_when_the_build_knows_the_repository(browser, live):
    _FakeBinder.ready = {"url": live.kernel_url, "token": live.token}
    binder = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeBinder)
    threading.Thread(target=binder.serve_forever, daemon=True).start()
    settings = {"binder": {"url": f"http://127.0.0.1:{binder.server_address[1]}", "spec": "gh/example/book/main",
                           "path_to_docs": "docs"}}
    seen = Visit(browser, "about:blank", "light")
    try:
        # As a page built with a repository would have it (the static host has no _live/config.json).
        seen.context.add_init_script(
            "Object.defineProperty(window, 'attentionRefLiveCodeConfig', {get: () => (SETTINGS), set: () => {}});"
            .replace("SETTINGS", json.dumps(settings)))
        seen.page.route("**/_live/config.json", lambda route: route.fulfill(status=404, body="static host"))
        seen.open(urljoin(live.url, CHAPTER))
        seen.page.get_by_role("button", name="Live code", exact=True).click()
        seen.page.wait_for_function("() => ['ready', 'failed'].includes(attentionRefLiveCode.state)", timeout=READY)
        assert "Binder" in seen.page.locator(".live-code-status").inner_text()
        assert seen.page.evaluate("attentionRefLiveCode.state") == "ready"
        assert _FakeBinder.asked == ["/build/gh/example/book/main"]
        assert "stargazing" not in _run(seen.page.locator(".live-code-cell").first)
    finally:
        seen.close()
        binder.shutdown()
        binder.server_close()


# -- The kernel server's locks -----------------------------------------------------------------------------------


def _http(url, headers=None, method="GET", data=None):
    request = urllib.request.Request(url, headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_the_kernel_server_needs_the_token(live):
    assert _http(f"{live.kernel_url}api/kernels")[0] == 403
    assert _http(f"{live.kernel_url}api/kernels", {"Authorization": "token wrong"})[0] == 403
    assert _http(f"{live.kernel_url}api/kernels", method="POST", data=b'{"name": "python3"}',
                 headers={"Content-Type": "application/json", "Origin": live.origin})[0] == 403
    assert _http(f"{live.kernel_url}api/kernels", {"Authorization": f"token {live.token}"})[0] == 200
    # The token is in no built file: only the running server hands it out.
    assert not any(live.token in path.read_text(errors="ignore") for path in SITE.rglob("*.html"))


def test_the_kernel_server_refuses_other_origins(live):
    token = {"Authorization": f"token {live.token}"}
    for origin in ("http://127.0.0.1:9", "https://example.org", "null"):
        status, _ = _http(f"{live.kernel_url}api/kernels", {**token, "Origin": origin})
        assert status == 404, origin  # jupyter_server's answer to a refused origin
        status, _ = _http(f"{live.kernel_url}api/kernels", {**token, "Origin": origin,
                                                            "Content-Type": "application/json"},
                          method="POST", data=b'{"name": "python3"}')
        assert status == 404, origin
    assert _http(f"{live.kernel_url}api/kernels", {**token, "Origin": live.origin})[0] == 200
    # The configuration endpoint answers the book's own pages only.
    assert _http(f"{live.url}_live/config.json", {"Origin": "https://example.org"})[0] == 403
    assert _http(f"{live.url}_live/config.json", {"Sec-Fetch-Site": "cross-site"})[0] == 403
    status, body = _http(f"{live.url}_live/config.json", {"Origin": live.origin, "Sec-Fetch-Site": "same-origin"})
    assert status == 200 and json.loads(body)["token"] == live.token


def test_the_kernel_websocket_refuses_other_origins(live):
    import base64
    import http.client

    status, body = _http(f"{live.kernel_url}api/kernels", {"Authorization": f"token {live.token}",
                                                           "Content-Type": "application/json"},
                         method="POST", data=b'{"name": "python3"}')
    assert status == 201
    kernel = json.loads(body)["id"]

    def handshake(origin):
        """Status of a WebSocket opening handshake to the kernel's channels, with the token, from `origin`."""
        connection = http.client.HTTPConnection("127.0.0.1", live.kernel_port, timeout=30)
        try:
            connection.request("GET", f"/api/kernels/{kernel}/channels?token={live.token}", headers={
                "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(), "Origin": origin,
            })
            return connection.getresponse().status
        finally:
            connection.close()

    try:
        assert handshake("https://example.org") == 403
        assert handshake("http://127.0.0.1:9") == 403
        assert handshake(live.origin) == 101
    finally:
        _http(f"{live.kernel_url}api/kernels/{kernel}", {"Authorization": f"token {live.token}"}, method="DELETE")


# -- Hosted: launch links for a known repository ---------------------------------------------------------------


@pytest.fixture(scope="module")
def live_code():
    return ext_module("live_code", "sphinx")


@pytest.mark.parametrize("url", ["https://github.com/example/book", "https://github.com/example/book.git",
                                 "git@github.com:example/book.git", "https://github.com/example/book/"])
def test_hosted_options_for_a_github_repository(live_code, url):
    theme, binder = live_code.hosted_options(url, "dev", "docs")
    assert theme["repository_url"] == "https://github.com/example/book"
    assert theme["repository_branch"] == "dev" and theme["path_to_docs"] == "docs"
    assert theme["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    assert theme["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert binder == {"url": "https://mybinder.org", "spec": "gh/example/book/dev", "path_to_docs": "docs"}


def test_hosted_options_elsewhere(live_code):
    theme, binder = live_code.hosted_options("https://gitlab.com/example/book.git", "main")
    assert "colab_url" not in theme["launch_buttons"] and binder["spec"] == "gl/example%2Fbook/main"
    assert live_code.hosted_options("https://example.org/git/book.git", "main") == ({}, None)
    assert live_code.hosted_options("", "main") == ({}, None)


@pytest.mark.docs
def test_a_book_with_a_repository_links_binder_and_colab(tmp_path):
    """A tiny book with the book's extensions and theme, its repository given as Read the Docs gives it."""
    require("myst_nb")
    require("sphinx_book_theme")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(EXT)!r})\n"
        "extensions = ['myst_nb', 'notebook_download', 'live_code']\n"
        "html_theme = 'sphinx_book_theme'\n"
        "nb_execution_mode = 'off'\n"
        "exclude_patterns = ['_build']\n"
    )
    front = "---\nfile_format: mystnb\nkernelspec:\n  name: python3\n  display_name: Python 3\n---\n"
    (docs / "index.md").write_text("# Book\n\n```{toctree}\ntext\nuncommitted\nnotebook\n```\n")
    (docs / "text.md").write_text(front + "# Text\n\n```{code-cell} ipython3\n1 + 1\n```\n")
    (docs / "uncommitted.md").write_text(front + "# No notebook\n\n```{code-cell} ipython3\n3 + 3\n```\n")
    notebook = {"cells": [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": "# Notebook"},
                          {"cell_type": "code", "id": "b", "metadata": {}, "execution_count": None, "outputs": [],
                           "source": "2 + 2"}],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (docs / "notebook.ipynb").write_text(json.dumps(notebook))
    # The repository's committed notebook of text.md (_launch_notebooks writes these); uncommitted.md has none.
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "text.ipynb").write_text(json.dumps(notebook))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("READTHEDOCS", "ATTENTION_REF"))}
    env["READTHEDOCS_GIT_CLONE_URL"] = "https://github.com/example/book.git"
    env["READTHEDOCS_GIT_IDENTIFIER"] = "stable"
    out = tmp_path / "html"
    result = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(docs), str(out)],
                            env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text, nb, bare = ((out / f"{page}.html").read_text() for page in ("text", "notebook", "uncommitted"))
    binder = "https://mybinder.org/v2/gh/example/book/stable?urlpath=lab/tree/{}"
    colab = "https://colab.research.google.com/github/example/book/blob/stable/{}"
    assert binder.format("notebooks/text.ipynb") in text and colab.format("notebooks/text.ipynb") in text
    assert binder.format("docs/notebook.ipynb") in nb and colab.format("docs/notebook.ipynb") in nb
    launch = re.findall(r"https://(?:mybinder\.org/v2|colab\.research\.google\.com)[^\"'\s<]*", text)
    assert launch and all(url.endswith("/notebooks/text.ipynb") for url in launch), launch
    # No committed notebook: no launch links (Colab and Binder would open Markdown), but live code still.
    assert "mybinder.org/v2" not in bare and "colab.research.google.com" not in bare
    for page in (text, nb, bare):
        assert 'class="btn btn-sm btn-live-code' in page and "Live code" in page
        assert '"spec": "gh/example/book/stable"' in page
    # The downloadable notebook is the book's (a setup cell first), not the theme's raw copy; its setup cell
    # installs the package from the repository the build knows.
    download = json.loads((out / "_sources" / "text.ipynb").read_text())
    assert download["cells"][0]["metadata"]["tags"] == ["setup"]
    assert "'attention_ref @ git+https://github.com/example/book.git@stable'" in "".join(download["cells"][0]["source"])

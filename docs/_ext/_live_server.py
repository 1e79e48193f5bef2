"""``make serve``: the built book on 127.0.0.1 with a Jupyter kernel server beside it, for the pages' live code.

Not a Sphinx extension: the program ``make serve`` runs (``python docs/_ext/_live_server.py docs/_build/html``),
and the code tests/test_live.py starts on free ports. Two servers, both bound to 127.0.0.1:

* the book, as a static host serves it, with these locks:

  - every request must name this server in ``Host`` (``127.0.0.1:PORT``; ``localhost:PORT`` is redirected there,
    the one origin the kernel server accepts): any other name gets 421, so a DNS-rebinding page learns nothing;
  - a request target that is not a clean path (NUL or control characters, bad percent-encoding, over
    ``MAX_TARGET`` characters, absolute form) gets 400; a folder without an ``index.html`` gets 404, not a listing;
  - ``/_live/config.json`` gives the pages the kernel server's address and token. The token is random for each
    run and exists only in this process and the kernel server's (handed over on its standard input, so it is
    in no file, no command line and no environment). The endpoint answers only a browser that has been let in
    (its cookie) and marks the request ``Sec-Fetch-Site: same-origin``; anything else gets 403, and the pages
    still read normally. A browser is let in by the link ``make serve`` prints, ``http://127.0.0.1:PORT/?key=K``:
    opening it sets an ``HttpOnly``, ``SameSite=Strict`` cookie and redirects to the same page without the key.
    Each key works once; when it is used the server prints a fresh link (for another browser or profile), so a
    link left in a browser's history or on a shared screen is already spent.

* jupyter_server (the ``live`` extra), with that token, ``allow_origin`` set to the book's origin, no
  configuration files or server extensions (``JUPYTER_NO_CONFIG``), and only the ``api`` and ``kernels`` services:
  no contents, files, sessions, terminals or nbconvert. Its root, and so its kernels' working folder, is a scratch
  folder of this run that mirrors the repository's layout with copies of the files the chapters read while they
  run (``RUNTIME_FILES``: the figure style, the frameworks record, the benchmark record), so a reader's code
  writes there, not into the repository. Its identity provider checks the origin of every request:
  jupyter_server by default skips that check for token-authenticated requests, so another site's page holding
  the token could still use it.

What this does not stop: anyone holding an unused link, or the browser profile that opened one, can run code as
the user who started the server; so can the user's own processes, which can read everything anyway.

Ctrl-C stops both. Relies on jupyter_server's ``PasswordIdentityProvider.should_check_origin(handler)`` and
``ServerApp.default_services``, checked when the kernel server imports this module. Verified with jupyter_server
2.21.1 and tornado 6.6.1.
"""

from __future__ import annotations

import argparse
import functools
import http.cookies
import http.server
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import ClassVar

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONFIG_PATH = "/_live/config.json"
HOST = "127.0.0.1"
MAX_TARGET = 2048  # characters of a request target; the book's longest URL is far shorter
# What the chapters read while they run, relative to the repository (and so to the kernels' scratch root):
# docs/chapters/matplotlibrc (the figure style, read from the working folder), frameworks.md's record,
# performance.md's ../../benchmarks/results.json.
RUNTIME_FILES = ("docs/chapters/matplotlibrc", "docs/chapters/frameworks_record.json", "benchmarks/results.json")
# The client's services only: /api/status, the kernels' REST API and their WebSocket channels.
KERNEL_SERVICES = ("api", "kernels")
# Credentials a parent environment may carry that must not reach the kernel server or its kernels.
SECRET_VARIABLES = ("JUPYTER_TOKEN", "JUPYTER_TOKEN_FILE", "JUPYTER_PASSWORD")

try:  # in the kernel server's process (jupyter_server is installed there)
    from jupyter_server.auth.identity import PasswordIdentityProvider
    from jupyter_server.serverapp import ServerApp
except ImportError:  # pragma: no cover - the static half runs without jupyter_server
    PasswordIdentityProvider = ServerApp = None
else:
    from _upstream import require

    require(__name__, PasswordIdentityProvider, "should_check_origin", ("self", "handler"), "jupyter_server")
    if not set(KERNEL_SERVICES) <= set(ServerApp.default_services):
        raise RuntimeError(f"jupyter_server's ServerApp.default_services {ServerApp.default_services} lacks "
                           f"{KERNEL_SERVICES}; _live_server.py needs updating")

    class SameOriginIdentityProvider(PasswordIdentityProvider):
        """Token authentication as usual, and every request's ``Origin`` checked against ``allow_origin``."""

        def should_check_origin(self, handler):
            return True

    class KernelServerApp(ServerApp):
        """jupyter_server with the kernels' API only (``default_services`` is its documented way to narrow it)."""

        default_services = KERNEL_SERVICES


def serve_kernels(argv=None):
    """The kernel server's process: its token is the first line of standard input, the rest as ServerApp's."""
    from traitlets.config import Config

    token = sys.stdin.readline().strip()
    if not token:
        raise SystemExit("_live_server.serve_kernels: no token on standard input")
    KernelServerApp.launch_instance(argv, config=Config({"IdentityProvider": {"token": token}}))


class StaticHandler(http.server.SimpleHTTPRequestHandler):
    """A folder as a static host serves it: keep-alive connections, notebooks as JSON, no log lines, and a
    ``no-cache`` header, so the browser keeps what it fetched but asks whether it changed (a 304 reply reuses its
    copy): every page's requests still reach the server."""

    protocol_version = "HTTP/1.1"  # keep-alive: a page's many assets reuse one connection

    def cache_control(self):
        return "no-cache"

    def end_headers(self):
        self.send_header("Cache-Control", self.cache_control())
        super().end_headers()

    def guess_type(self, path):
        return "application/json" if str(path).endswith(".ipynb") else super().guess_type(path)

    def log_message(self, format, *args):
        pass


def target_problem(target: str) -> str | None:
    """Why `target` (a request line's path and query) is not a clean origin-form target, or None if it is."""
    if len(target) > MAX_TARGET:
        return f"request target longer than {MAX_TARGET} characters"
    if not target.startswith("/") or target.startswith("//"):
        return "request target is not a path"
    if re.search(r"%(?![0-9A-Fa-f]{2})", target):
        return "bad percent-encoding"
    try:
        text = urllib.parse.unquote(target, errors="strict")
    except UnicodeDecodeError:
        return "percent-encoding that is not UTF-8"
    if re.search(r"[\x00-\x1f\x7f]", text):
        return "control character in the request target"
    return None


class Gate:
    """Who may read the kernel server's token: browsers let in by a one-time key, on this server's own origin."""

    def __init__(self, port, announce=None):
        self.port = port
        self.origin = f"http://{HOST}:{port}"
        self.hosts = {f"{HOST}:{port}": "here", f"localhost:{port}": "redirect"}
        self.cookie = f"attention_ref_live_{port}"  # cookies are per host, not per port: one name per server
        self.announce = announce or (lambda url: None)
        self.sessions: set[str] = set()
        self.lock = threading.Lock()
        self.key = secrets.token_urlsafe(32)

    @property
    def login_url(self):
        return f"{self.origin}/?key={self.key}"

    def redeem(self, key: str) -> str | None:
        """A new session for the browser presenting the current `key` (then replaced by a fresh one), else None."""
        with self.lock:
            if not secrets.compare_digest(key.encode(), self.key.encode()):
                return None
            self.key = secrets.token_urlsafe(32)
            session = secrets.token_urlsafe(32)
            self.sessions.add(session)
            fresh = self.login_url
        self.announce(fresh)
        return session

    def admits(self, cookie_header: str | None) -> bool:
        cookies = http.cookies.SimpleCookie()
        try:
            cookies.load(cookie_header or "")
        except http.cookies.CookieError:
            return False
        morsel = cookies.get(self.cookie)
        return morsel is not None and any(secrets.compare_digest(morsel.value.encode(), s.encode())
                                          for s in list(self.sessions))


class BookHandler(StaticHandler):
    """The built book, answering only its own origin, plus ``/_live/config.json`` for browsers let in."""

    live: ClassVar[dict] = {}  # set per server: base_url, token, path_to_docs
    gate: ClassVar[Gate]

    def parse_request(self):
        if not super().parse_request():
            return False
        hosts = self.headers.get_all("Host") or []
        if len(hosts) != 1:
            self.send_error(400, "exactly one Host header expected")
            return False
        where = self.gate.hosts.get(hosts[0].lower())
        if where is None:
            self.send_error(421, f"this server answers only {self.gate.origin}/")
            return False
        problem = target_problem(self.path)
        if problem:
            self.send_error(400, problem)
            return False
        if where == "redirect":  # the kernel server accepts one origin, and the cookie is per host
            self.send_response(307)
            self.send_header("Location", self.gate.origin + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        return True

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path == CONFIG_PATH:
            return self._config()
        keys = urllib.parse.parse_qs(query, keep_blank_values=True).get("key")
        if keys is not None:
            return self._login(path, query, keys[0])
        return super().do_GET()

    def send_head(self):
        folder = Path(self.translate_path(self.path))
        if folder.is_dir() and not (folder / "index.html").is_file():
            self.send_error(404, "no such page")  # never a directory listing
            return None
        return super().send_head()

    def _login(self, path, query, key):
        session = self.gate.redeem(key)
        if session is None and not self.gate.admits(self.headers.get("Cookie")):
            self.send_error(403, "this link is not valid or was already used",
                            "Live code: open the newest link that `make serve` printed in its terminal. "
                            "Each link works once; the book itself reads without one.")
            return
        rest = urllib.parse.urlencode([(k, v) for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True)
                                       if k != "key"])
        self.send_response(303)
        self.send_header("Location", path + (f"?{rest}" if rest else ""))
        if session is not None:
            self.send_header("Set-Cookie", f"{self.gate.cookie}={session}; Path=/; HttpOnly; SameSite=Strict")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _config(self):
        origin = self.headers.get("Origin")
        if not self.gate.admits(self.headers.get("Cookie")):
            refusal = "this browser has not opened the link `make serve` printed"
        elif self.headers.get("Sec-Fetch-Site") != "same-origin" or origin not in (None, self.gate.origin):
            refusal = "same-origin requests only"
        else:
            refusal = None
        status, answer = (403, {"refused": refusal}) if refusal else (200, self.live)
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def cache_control(self):
        # The configuration holds the token, a login answer sets the cookie: never stored.
        path, _, query = self.path.partition("?")
        return "no-store" if path == CONFIG_PATH or "key=" in query else super().cache_control()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def scratch_root(repository: Path, into: Path) -> Path:
    """`into`, holding read-only copies of the repository's `RUNTIME_FILES` at the same relative places."""
    for name in RUNTIME_FILES:
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (repository / name).is_file():
            shutil.copyfile(repository / name, target)
            target.chmod(0o444)
    return into


class LiveServer:
    """The book at `site` on 127.0.0.1:`port` and a kernel server on 127.0.0.1:`kernel_port` (0: a free port).

    `announce(url)` is called with each fresh login link after one is used (``make serve`` prints it)."""

    def __init__(self, site, port=0, kernel_port=0, root=ROOT, path_to_docs="docs", log=None, handler=BookHandler,
                 announce=None):
        self.site = Path(site)
        if not (self.site / "index.html").is_file():
            raise FileNotFoundError(f"no built book in {self.site} (run `make docs`)")
        self.token = secrets.token_urlsafe(32)
        handler = type("Handler", (handler,), {"live": {}})
        self.httpd = http.server.ThreadingHTTPServer((HOST, port), functools.partial(handler, directory=str(self.site)))
        self.httpd.daemon_threads = True
        self.gate = handler.gate = Gate(self.httpd.server_address[1], announce)
        self.url = f"{self.gate.origin}/"
        self.origin = self.gate.origin
        self.kernel_port = kernel_port or _free_port()
        self.kernel_url = f"http://{HOST}:{self.kernel_port}/"
        handler.live = {"base_url": self.kernel_url, "token": self.token, "path_to_docs": path_to_docs}
        self.root = Path(root)
        self.log = log or tempfile.NamedTemporaryFile(prefix="live-kernel-server-", suffix=".log", delete=False)
        self.process = None

    @property
    def login_url(self):
        """The link that lets a browser in, until it is used."""
        return self.gate.login_url

    def start(self, timeout=60):
        env = {name: value for name, value in os.environ.items() if name not in SECRET_VARIABLES}
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["JUPYTER_NO_CONFIG"] = "1"  # no user or system configuration, so no server extensions
        self.runtime = tempfile.TemporaryDirectory(prefix="live-kernel-runtime-")
        env["JUPYTER_RUNTIME_DIR"] = self.runtime.name  # connection files and cookie secret: this run's only
        self.scratch = tempfile.TemporaryDirectory(prefix="live-kernels-")
        scratch_root(self.root, Path(self.scratch.name))
        self.process = subprocess.Popen(
            [
                sys.executable, "-c", "import _live_server; _live_server.serve_kernels()",
                f"--ServerApp.ip={HOST}",
                f"--ServerApp.port={self.kernel_port}",
                "--ServerApp.port_retries=0",
                "--ServerApp.open_browser=False",
                f"--ServerApp.allow_origin={self.origin}",
                f"--ServerApp.root_dir={self.scratch.name}",
                "--ServerApp.terminals_enabled=False",
                "--ServerApp.identity_provider_class=_live_server.SameOriginIdentityProvider",
                *(["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []),  # CI and containers run as root
            ],
            env=env, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # Ctrl-C reaches this process only; it stops the kernel server cleanly
        )
        self.process.stdin.write(self.token + "\n")
        self.process.stdin.close()
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the kernel server stopped (exit {self.process.returncode}); see {self.log.name}")
            try:
                request = urllib.request.Request(f"{self.kernel_url}api/status",
                                                 headers={"Authorization": f"token {self.token}"})
                with urllib.request.urlopen(request, timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the kernel server did not start in {timeout} s; see {self.log.name}") from None
                time.sleep(0.2)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.process and self.process.poll() is None:
            self.process.terminate()  # jupyter_server shuts its kernels down on SIGTERM
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process:
            self.runtime.cleanup()
            self.scratch.cleanup()
        self.log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "docs" / "_build" / "html"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
    parser.add_argument("--kernel-port", type=int, default=0)
    args = parser.parse_args(argv)
    # Ctrl-C (and a plain kill) stop both servers, even where the shell started this with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    def announce(url):
        print(f"That link is used. For another browser, open: {url}", flush=True)

    server = LiveServer(args.site, args.port, args.kernel_port, announce=announce)
    print(f"starting the kernel server (log: {server.log.name})...", flush=True)
    with server:
        print(f"The book: {server.url}  (Ctrl-C stops the book and its kernel server)\n"
              f"For live code, open this link (it works once, in one browser): {server.login_url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("\nstopping...", flush=True)


if __name__ == "__main__":
    main()

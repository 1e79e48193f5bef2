"""``make serve``: the built book on 127.0.0.1 with a Jupyter kernel server beside it, for the pages' live code.

Not a Sphinx extension: the program ``make serve`` runs (``python docs/_ext/_live_server.py docs/_build/html``),
and the code tests/test_live.py starts on free ports. Two servers, both bound to 127.0.0.1:

* the book, as a static host serves it, plus one same-origin endpoint, ``/_live/config.json``, giving the pages
  the kernel server's address and token. The token is random for each run and exists only in this process and
  the kernel server's environment: it is never written into the built files. The endpoint refuses requests a
  browser marks as coming from another site (``Sec-Fetch-Site``) or that carry another ``Origin``.
* jupyter_server (the ``live`` extra), started with that token, ``allow_origin`` set to the book's origin, no
  terminals and its root at the repository, so a page's kernel starts in the page's own folder
  (``docs/chapters``: the figure style and the benchmark record are where the chapters expect them). Its
  identity provider checks the origin of every request: jupyter_server by default skips that check for
  token-authenticated requests, so another site's page holding the token could still use it.

Ctrl-C stops both. Relies on jupyter_server's ``PasswordIdentityProvider.should_check_origin(handler)``,
checked when the kernel server imports this module. Verified with jupyter_server 2.21.1 and tornado 6.6.1.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import ClassVar

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONFIG_PATH = "/_live/config.json"
HOST = "127.0.0.1"

try:  # in the kernel server's process (jupyter_server is installed there)
    from jupyter_server.auth.identity import PasswordIdentityProvider
except ImportError:  # pragma: no cover - the static half runs without jupyter_server
    PasswordIdentityProvider = None
else:
    from _upstream import require

    require(__name__, PasswordIdentityProvider, "should_check_origin", ("self", "handler"), "jupyter_server")

    class SameOriginIdentityProvider(PasswordIdentityProvider):
        """Token authentication as usual, and every request's ``Origin`` checked against ``allow_origin``."""

        def should_check_origin(self, handler):
            return True


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


class BookHandler(StaticHandler):
    """The built book, plus ``/_live/config.json`` for pages of the same origin."""

    live: ClassVar[dict] = {}  # set per server: base_url, token, path_to_docs, origin

    def do_GET(self):
        if self.path.split("?")[0] == CONFIG_PATH:
            return self._config()
        return super().do_GET()

    def _config(self):
        origin = self.headers.get("Origin")
        site = self.headers.get("Sec-Fetch-Site")
        if (origin is not None and origin != self.live["origin"]) or site not in (None, "same-origin", "none"):
            self.send_error(403, "live code configuration: same origin only")
            return
        body = json.dumps({key: self.live[key] for key in ("base_url", "token", "path_to_docs")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def cache_control(self):
        # The configuration holds the token: never stored.
        return "no-store" if self.path.split("?")[0] == CONFIG_PATH else super().cache_control()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


class LiveServer:
    """The book at `site` on 127.0.0.1:`port` and a kernel server on 127.0.0.1:`kernel_port` (0: a free port)."""

    def __init__(self, site, port=0, kernel_port=0, root=ROOT, path_to_docs="docs", log=None, handler=BookHandler):
        self.site = Path(site)
        if not (self.site / "index.html").is_file():
            raise FileNotFoundError(f"no built book in {self.site} (run `make docs`)")
        self.token = secrets.token_urlsafe(32)
        handler = type("Handler", (handler,), {"live": {}})
        self.httpd = http.server.ThreadingHTTPServer((HOST, port), functools.partial(handler, directory=str(self.site)))
        self.httpd.daemon_threads = True
        self.url = f"http://{HOST}:{self.httpd.server_address[1]}/"
        self.origin = self.url.rstrip("/")
        self.kernel_port = kernel_port or _free_port()
        self.kernel_url = f"http://{HOST}:{self.kernel_port}/"
        handler.live = {"base_url": self.kernel_url, "token": self.token, "path_to_docs": path_to_docs,
                        "origin": self.origin}
        self.root = Path(root)
        self.log = log or tempfile.NamedTemporaryFile(prefix="live-kernel-server-", suffix=".log", delete=False)
        self.process = None

    def start(self, timeout=60):
        env = dict(os.environ, JUPYTER_TOKEN=self.token, PYTHONPATH=os.pathsep.join(
            [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.runtime = tempfile.TemporaryDirectory(prefix="live-kernel-runtime-")
        env["JUPYTER_RUNTIME_DIR"] = self.runtime.name  # connection files and cookie secret: this run's only
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter_server",
                f"--ServerApp.ip={HOST}",
                f"--ServerApp.port={self.kernel_port}",
                "--ServerApp.port_retries=0",
                "--ServerApp.open_browser=False",
                f"--ServerApp.allow_origin={self.origin}",
                f"--ServerApp.root_dir={self.root}",
                "--ServerApp.terminals_enabled=False",
                "--ServerApp.identity_provider_class=_live_server.SameOriginIdentityProvider",
                *(["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []),  # CI and containers run as root
            ],
            env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches this process only; it stops the kernel server cleanly
        )
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
    server = LiveServer(args.site, args.port, args.kernel_port)
    print(f"starting the kernel server (log: {server.log.name})...", flush=True)
    with server:
        print(f"The book, with live code: {server.url}  (Ctrl-C stops the book and its kernel server)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("\nstopping...", flush=True)


if __name__ == "__main__":
    main()

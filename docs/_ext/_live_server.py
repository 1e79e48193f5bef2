"""``make serve``: the built book on 127.0.0.1 with a Jupyter kernel server behind it, for the pages' live code.

Not a Sphinx extension: the program ``make serve`` runs (``python docs/_ext/_live_server.py docs/_build/html``),
and the code tests/test_live.py starts on free ports. Everything of a run lives in one private folder (mode
0700, ``ar-live-*`` in the temporary folder), deleted when it stops: the kernel server's log, its runtime folder
(its socket, connection files and the kernels' IPC sockets), the kernels' scratch working folder, and the home
and temporary folders the kernel server and its kernels are given (IPython, Jupyter and matplotlib write there,
not in the user's). Code run in live cells is kept in memory only (``HistoryManager.hist_file=:memory:``). One
TCP port, the book's, on 127.0.0.1:

* the book, as a static host serves it, with these locks:

  - every request must name this server in ``Host`` (``127.0.0.1:PORT``; ``localhost:PORT`` is redirected there):
    any other name gets 421, so a DNS-rebinding page learns nothing;
  - every answer carries ``Content-Security-Policy: frame-ancestors 'none'`` and ``X-Frame-Options: DENY``: no
    page of another origin can frame a chapter (and the page's script does nothing with a key or a session in a
    frame);
  - a request target that is not a clean path (NUL or control characters, bad percent-encoding, over
    ``MAX_TARGET`` characters, absolute form) gets 400; a folder without an ``index.html`` gets 404, not a
    listing; a symbolic link that leads out of the site gets 404;
  - at most ``MAX_CONNECTIONS`` connections at a time: for one more, the connection idle longest is closed
    (``_live_connections.py``: nobody is locked out by another's idle connections); a request must arrive whole
    (request line, headers, body) within ``REQUEST_DEADLINE`` seconds of the connection's wait for it, however
    slowly it trickles in; a silent connection is closed after ``READ_TIMEOUT`` seconds, or
    ``IDLE_WITHOUT_SESSION`` until a request on it shows a session; a request line that cannot be parsed gets
    400 and at most one quiet line in the terminal, never a traceback;
  - neither server sets a cookie, and no cookie is a credential. A browser sends every cookie of ``127.0.0.1`` to
    every port of it, and so to any other local user's server there, which can replay it. The link,
    ``http://127.0.0.1:PORT/#live-key=K``, carries a one-time key in its fragment, which the browser never sends
    anywhere. It is never printed, nor given to a browser as an argument (every local user can read a command
    line): ``make serve`` writes it into a private redirect page and prints that page's ``file://`` address
    (``_live_gate.py``). The page's script (``_static/live_code.js``) removes it from the address and trades it,
    in a same-origin ``POST /_live/session`` with the key in the ``X-Live-Key`` header, for a session secret that
    it keeps in ``sessionStorage``: storage of this origin (scheme, host and port), which no page of another port
    can read;
  - the kernels are reached through this server only, under ``/_live/api/kernels``: ``POST`` starts one, ``POST
    <id>/restart`` restarts it, ``DELETE <id>`` deletes it, and ``GET <id>/channels`` opens its WebSocket. Each
    needs a live session: in the ``X-Live-Session`` header of a request marked ``Sec-Fetch-Site: same-origin``
    (a page of another origin cannot send that header without a CORS preflight, which this server never grants),
    or, on the WebSocket handshake, where a browser can set no header, as the subprotocol ``live-session.S``
    beside ``attention-ref-live`` from an ``Origin`` of this server. A session reaches only the kernels it
    started. This server adds the kernel server's token itself: the browser never holds it, and no credential
    travels in a URL. ``GET /_live/config.json`` (same session header) tells a page that it is let in;
    ``POST /_live/release`` deletes the page's kernel when it is hidden for good (``pagehide``, ``keepalive``);
  - a key works once and expires unused after ``LINK_SECONDS``; after a use (announced with the time and the
    browser's ``User-Agent``) or an expiry the terminal gets a notice, not a fresh link: pressing Enter there
    writes a new one. A session expires after ``SESSION_IDLE_SECONDS`` without a request or a message to a
    kernel (WebSocket control frames do not count), and ``SESSION_LIFETIME_SECONDS`` after it began whatever
    its use; then its requests get 403 at once (saying so: the page asks for a new link), its WebSockets are
    closed and its kernels are shut down.

* jupyter_server (the ``live`` extra) on a Unix socket in the private runtime folder (mode 0600), which no other
  user can reach, with a random token, ``allow_origin`` set to the book's origin, no configuration files or
  server extensions (``JUPYTER_NO_CONFIG``), and only the ``api`` and ``kernels`` services: no contents, files
  (``/files/`` is not routed), sessions, terminals or nbconvert. Its identity provider takes the token from the
  ``Authorization`` header only, checks every request's origin, and neither sets nor reads a cookie (tornado's
  ``set_cookie`` does nothing in that process, so no ``_xsrf`` cookie either; the book server forwards no header
  of its answers anyway). The token is handed over on standard input and written to no file (the server's
  ``jpserver-*.json`` and ``-open.html`` files are not written), and it is in no URL, so in no log line. Kernels
  talk to it over IPC sockets in the private runtime folder, not TCP ports, and are ``_live_kernel.py`` (the one
  kernel spec), which opens no TCP port either; each starts in the scratch folder's ``KERNEL_FOLDER`` (the
  client's kernel ``name``, ``path`` and ``kernel_id`` are ignored), at most ``MAX_KERNELS`` at a time (one more
  gets 429 and a message the page shows), and one idle for ``KERNEL_IDLE_SECONDS`` without a page connected is
  shut down. The scratch folder mirrors the repository's layout with copies of the files the chapters read while
  they run (``RUNTIME_FILES``: the figure style, the frameworks, benchmark, GPU and sensitivity records), so a
  reader's code writes there, not into the repository.

What this does not stop: the browser tab that traded a link for a session (and anything that takes over that
browser) can run code as the user who started the server, until the session expires or the server stops; so can
the user's own processes and root, which can read everything anyway.

Ctrl-C, SIGTERM and SIGHUP (the terminal closed) stop both. The kernel server reads a pipe from the book server
and, at its end (the book server gone, however it ended), stops as on SIGTERM and deletes the run's folder: no
process or file of the run outlives it. Relies on jupyter_server's ``IdentityProvider`` (``get_user``,
``get_user_cookie``, ``set_login_cookie``, ``auth_header_pat``), ``AsyncMappingKernelManager.start_kernel``,
``ContentsManager.get_extra_handlers``, ``ServerApp.write_server_info_file``/``write_browser_open_files``,
``ServerApp.sock`` and ``ServerApp.default_services``, and tornado's ``RequestHandler.set_cookie``, checked when
the kernel server imports this module. Verified with jupyter_server 2.21.1, jupyter_client 8.10.0, ipykernel
7.4.0 and tornado 6.6.1.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import http.client
import http.server
import io
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
import urllib.parse
from pathlib import Path
from typing import ClassVar

from _live_connections import (
    IDLE_WITHOUT_SESSION,
    MAX_CONNECTIONS,
    READ_TIMEOUT,
    SECURITY_HEADERS,
    BookServer,
    ClientFrames,
    DeadlineReader,
    splice,
)
from _live_gate import HOST, LINK_SECONDS, SESSION_IDLE_SECONDS, SESSION_LIFETIME_SECONDS, Gate, printable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONFIG_PATH = "/_live/config.json"
SESSION_PATH = "/_live/session"
RELEASE_PATH = "/_live/release"
KERNELS_PATH = "/_live/api/kernels"  # the book server's door to the kernel server's /api/kernels
KEY_HEADER = "X-Live-Key"
SESSION_HEADER = "X-Live-Session"
SUBPROTOCOL = "attention-ref-live"  # the WebSocket subprotocol the book server answers
SESSION_PROTOCOL = "live-session."  # + the session: how a browser's WebSocket handshake carries it
MAX_TARGET = 2048  # characters of a request target; the book's longest URL is far shorter
MAX_BODY = 1024  # bytes of a POST body (a kernel id)
REQUEST_DEADLINE = 20  # s for a whole request to arrive, counted from when the server starts waiting for it
UPSTREAM_TIMEOUT = 120  # s the book server waits for the kernel server (a restart waits for the kernel)
KERNEL_IDLE_SECONDS = 1800  # a kernel idle for 30 minutes with no page connected is shut down
MAX_KERNELS = 8  # kernels at a time (each about 50 MB)
KERNEL_FOLDER = "docs/chapters"  # every kernel's working folder, in the scratch copy of the repository
KERNEL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The kernels' API as the book server passes it on: (method, path after KERNELS_PATH) -> what it is.
KERNEL_ROUTES = {("POST", re.compile(r"/?")): "start", ("POST", re.compile(rf"/({KERNEL_ID.pattern})/restart")):
                 "restart", ("DELETE", re.compile(rf"/({KERNEL_ID.pattern})")): "delete",
                 ("GET", re.compile(rf"/({KERNEL_ID.pattern})/channels")): "channels"}
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455's constant for Sec-WebSocket-Accept
# What the chapters read while they run, relative to the repository (and so to the kernels' scratch root):
# docs/chapters/matplotlibrc (the figure style, read from the working folder), frameworks.md's record,
# performance.md's ../../benchmarks/results.json, testing_your_kernel.md's ../../benchmarks/check_speed.json.
RUNTIME_FILES = ("docs/chapters/matplotlibrc", "docs/chapters/frameworks_record.json", "benchmarks/results.json",
                 "benchmarks/check_speed.json",
                 "docs/chapters/gpu_record.json", "docs/chapters/sensitivity_record.json")
# The client's services only: /api/status, the kernels' REST API and their WebSocket channels.
KERNEL_SERVICES = ("api", "kernels")
# Credentials a parent environment may carry that must not reach the kernel server or its kernels.
SECRET_VARIABLES = ("JUPYTER_TOKEN", "JUPYTER_TOKEN_FILE", "JUPYTER_PASSWORD")
# Where Python, IPython, Jupyter and matplotlib would write outside the run's folder: set into it, or unset.
PRIVATE_FOLDERS = ("HOME", "TMPDIR", "IPYTHONDIR", "MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                   "XDG_DATA_HOME", "XDG_STATE_HOME", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR")

try:  # in the kernel server's process (jupyter_server is installed there)
    from jupyter_server.auth.identity import IdentityProvider, User
    from jupyter_server.serverapp import ServerApp
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
except ImportError:  # pragma: no cover - the static half runs without jupyter_server
    IdentityProvider = ServerApp = None
else:
    from _upstream import require
    from tornado import web
    from traitlets import Integer, Unicode

    for name, parameters in [("get_user", ("self", "handler")), ("get_user_cookie", ("self", "handler")),
                             ("set_login_cookie", ("self", "handler", "user")),
                             ("should_check_origin", ("self", "handler"))]:
        require(__name__, IdentityProvider, name, parameters, "jupyter_server")
    require(__name__, AsyncMappingKernelManager, "start_kernel", ("self",), "jupyter_server")
    require(__name__, AsyncLargeFileManager, "get_extra_handlers", ("self",), "jupyter_server")
    for name in ("write_server_info_file", "write_browser_open_files"):
        require(__name__, ServerApp, name, ("self",), "jupyter_server")
    require(__name__, web.RequestHandler, "set_cookie", ("self", "name", "value"), "tornado")
    if not set(KERNEL_SERVICES) <= set(ServerApp.default_services):
        raise RuntimeError(f"jupyter_server's ServerApp.default_services {ServerApp.default_services} lacks "
                           f"{KERNEL_SERVICES}; _live_server.py needs updating")
    if not isinstance(ServerApp.class_traits().get("sock"), Unicode):
        raise RuntimeError("jupyter_server's ServerApp has no `sock` option; _live_server.py needs updating")

    class TokenOnlyIdentityProvider(IdentityProvider):
        """The token in the ``Authorization`` header, compared in constant time, is the only credential (never
        a URL's query, never a cookie): no cookie is written or read, every request's ``Origin`` is checked
        against ``allow_origin``, and there is no login or logout page."""

        reader = User(username="reader", name="reader", display_name="reader")

        def get_user(self, handler):
            found = self.auth_header_pat.match(handler.request.headers.get("Authorization", ""))
            supplied = found.group(2) if found else ""
            if not (self.token and supplied and secrets.compare_digest(supplied.encode(), self.token.encode())):
                return None
            handler._token_authenticated = True  # jupyter_server's mark: no XSRF cookie check for this request
            return self.reader

        def get_user_cookie(self, handler):
            return None

        def set_login_cookie(self, handler, user):
            pass

        def clear_login_cookie(self, handler):
            pass

        def should_check_origin(self, handler):
            return True

        @property
        def login_available(self):
            return False

        @property
        def logout_available(self):
            return False

    class LiveKernelManager(AsyncMappingKernelManager):
        """Kernels of the default spec started in the server's `kernel_folder` (never the client's ``name``,
        ``path`` or ``kernel_id``), at most `max_kernels` at a time."""

        max_kernels = Integer(MAX_KERNELS, config=True, help="Kernels at a time; one more gets 429.")
        kernel_folder = Unicode(KERNEL_FOLDER, config=True, help="Every kernel's folder, relative to root_dir.")
        starting = 0  # kernels being started, not yet counted by len(self)

        async def start_kernel(self, *, kernel_id=None, path=None, **kwargs):
            if len(self) + self.starting >= self.max_kernels:
                raise web.HTTPError(429, f"Live code: this book's server already runs {self.max_kernels} kernels, "
                                         "its limit. Close another page that uses Live code, or wait until an "
                                         "unused kernel is shut down, then press Restart kernel.")
            self.starting += 1
            kwargs["kernel_name"] = self.default_kernel_name  # the one kernel spec (_live_kernel.py)
            try:
                return await super().start_kernel(path=self.kernel_folder, **kwargs)
            finally:
                self.starting -= 1

    class NoFilesContentsManager(AsyncLargeFileManager):
        """The contents manager jupyter_server needs, without the ``/files/`` route it adds."""

        def get_extra_handlers(self):
            return []

    class KernelServerApp(ServerApp):
        """jupyter_server with the kernels' API only (``default_services`` is its documented way to narrow it),
        writing no file that holds the token."""

        default_services = KERNEL_SERVICES

        def write_server_info_file(self):
            pass

        def write_browser_open_files(self):
            pass


def serve_kernels(argv=None):
    """The kernel server's process: its token is the first line of standard input, the rest as ServerApp's.
    No handler of this process sets a cookie (jupyter_server's pages and errors would set ``_xsrf``).

    Standard input stays open as long as the book server runs: at its end (the book server gone, however it
    ended, SIGKILL included) this process stops as on SIGTERM (jupyter_server shuts its kernels down), then
    deletes the run's folder, its working folder, which the book server can no longer delete."""
    from traitlets.config import Config

    token = sys.stdin.readline().strip()
    if not token:
        raise SystemExit("_live_server.serve_kernels: no token on standard input")
    web.RequestHandler.set_cookie = lambda self, name, value, *args, **kwargs: None
    orphaned = threading.Event()

    def watch_parent():
        sys.stdin.read()  # returns at the end of standard input: the book server closed it or ended
        orphaned.set()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch_parent, daemon=True).start()
    try:
        KernelServerApp.launch_instance(argv, config=Config({"IdentityProvider": {"token": token}}))
    finally:
        run_dir = Path.cwd()
        if orphaned.is_set() and run_dir.name.startswith("ar-live-"):
            shutil.rmtree(run_dir, ignore_errors=True)


class StaticHandler(http.server.SimpleHTTPRequestHandler):
    """A folder as a static host serves it: keep-alive connections, notebooks as JSON, no log lines, a
    ``no-cache`` header (the browser keeps what it fetched but asks whether it changed: every page's requests
    still reach the server), and `SECURITY_HEADERS` on every answer."""

    protocol_version = "HTTP/1.1"  # keep-alive: a page's many assets reuse one connection

    def cache_control(self):
        return "no-cache"

    def end_headers(self):
        self.send_header("Cache-Control", self.cache_control())
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
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


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the kernel server's Unix socket."""

    def __init__(self, path, timeout):
        super().__init__(HOST, timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.unix_path))


class KernelServer:
    """The kernel server as the book server reaches it: its Unix socket at `path`, its `token` in a header, and
    `origin` (the book's, the one it allows)."""

    def __init__(self, path, token, origin):
        self.path, self.token, self.origin = Path(path), token, origin

    def headers(self):
        return {"Authorization": f"token {self.token}", "Origin": self.origin, "Host": HOST}

    def request(self, method, target, body=None, timeout=UPSTREAM_TIMEOUT):
        """(status, body) of `method` `target` (``/api/...``); (502, b"") if the kernel server cannot be reached."""
        connection = _UnixConnection(self.path, timeout)
        try:
            headers = {**self.headers(), **({"Content-Type": "application/json"} if body is not None else {})}
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        except OSError:
            return 502, b""
        finally:
            connection.close()

    def open_channels(self, kernel, query, key, timeout=30):
        """A socket on which the kernel server has accepted `kernel`'s WebSocket for Sec-WebSocket-Key `key`,
        and the bytes it sent after its answer; or (None, status)."""
        upstream = socket.socket(socket.AF_UNIX)
        upstream.settimeout(timeout)
        try:
            upstream.connect(str(self.path))
            lines = [f"GET /api/kernels/{kernel}/channels{query} HTTP/1.1", "Upgrade: websocket",
                     "Connection: Upgrade", "Sec-WebSocket-Version: 13", f"Sec-WebSocket-Key: {key}",
                     *(f"{name}: {value}" for name, value in self.headers().items())]
            upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            answer = b""
            while b"\r\n\r\n" not in answer and len(answer) < 65536:
                chunk = upstream.recv(4096)
                if not chunk:
                    break
                answer += chunk
            head, _, rest = answer.partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 502
        except (OSError, ValueError, IndexError):
            upstream.close()
            return None, 502
        if status != 101:
            upstream.close()
            return None, status
        upstream.settimeout(None)
        return upstream, rest

    def delete(self, kernels):
        for kernel in kernels:
            self.request("DELETE", f"/api/kernels/{kernel}", timeout=30)


class BookHandler(StaticHandler):
    """The built book, answering only its own origin, plus ``/_live/`` for pages holding a session."""

    gate: ClassVar[Gate]
    kernel_server: ClassVar[KernelServer | None] = None  # set per server
    timeout = READ_TIMEOUT  # socketserver's per-connection read timeout
    idle_without_session = IDLE_WITHOUT_SESSION  # the same, until a request shows a live session
    request_deadline = REQUEST_DEADLINE
    deadline = None  # when the request being read must have arrived (monotonic s), None once it has
    path = ""  # the request's target, once its request line is read

    def setup(self):
        super().setup()
        self.rfile.close()
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, self))

    def idle_timeout(self):
        """How long this connection may stay silent: shorter until a request on it has shown a live session."""
        if self.server.state(self.connection).session:
            return self.timeout
        return min(self.timeout, self.idle_without_session)

    def handle_one_request(self):
        self.deadline = time.monotonic() + self.request_deadline
        self.path = ""
        self.server.waiting(self.connection)
        try:
            super().handle_one_request()
        finally:
            self._arrived()

    def _arrived(self):
        """The request has been read: no deadline, the usual read timeout again, and the connection is not one
        the server may drop for a newcomer while it is answered."""
        if self.deadline is not None:
            self.deadline = None
            self.connection.settimeout(self.timeout)
            self.server.answering(self.connection)

    def parse_request(self):
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = line.split()
        if not words:
            self.close_connection = True
            return False
        if len(words) != 3 or not re.fullmatch(r"HTTP/1\.[01]", words[2]):  # HTTP/2's preface, HTTP/0.9, junk
            self.requestline, self.command, self.request_version, self.close_connection = line, None, "HTTP/1.0", True
            self.send_error(400, "malformed request line")
            self.server.notice(f"refused a malformed request line, {printable(line, 80)!r}")
            return False
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
        if where == "redirect":  # page storage is per origin: one origin for the book
            self.send_response(307)
            self.send_header("Location", self.gate.origin + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        return True

    def do_GET(self):
        self._arrived()
        path = self.path.partition("?")[0]
        if path == CONFIG_PATH:
            return self._config()
        if path.startswith(KERNELS_PATH):
            return self._kernels(path, b"")
        return super().do_GET()

    def do_HEAD(self):
        self._arrived()
        return super().do_HEAD()

    def do_POST(self):
        path = self.path.partition("?")[0]
        if path not in (SESSION_PATH, RELEASE_PATH) and not path.startswith(KERNELS_PATH):
            self._arrived()
            return self.send_error(405, "the book is read-only")
        length = self.headers.get("Content-Length", "0")
        if not length.isdigit() or int(length) > MAX_BODY:
            self._arrived()
            return self.send_error(400, f"a body of at most {MAX_BODY} bytes expected")
        try:
            body = self.rfile.read(int(length))
        except OSError:  # the deadline passed, or the client went away
            self.close_connection = True
            return None
        self._arrived()
        if path.startswith(KERNELS_PATH):
            return self._kernels(path, body)
        if not self._same_origin():
            return self._answer(403, {"refused": "same-origin requests only"})
        if path == SESSION_PATH:
            key = self.headers.get(KEY_HEADER)
            session = self.gate.redeem(key, self.headers.get("User-Agent"))
            if session is None:  # the page says why: "used" (by whom?), "expired" or "unknown"
                return self._answer(403, {"refused": "this link is not valid, expired or was already used",
                                          "link": self.gate.refusal(key)})
            self.server.with_session(self.connection)
            return self._answer(200, {"session": session})
        return self._release(body)

    def do_DELETE(self):
        self._arrived()
        path = self.path.partition("?")[0]
        if not path.startswith(KERNELS_PATH):
            return self.send_error(405, "the book is read-only")
        return self._kernels(path, b"")

    def send_head(self):
        path = Path(self.translate_path(self.path))
        inside = Path(os.path.abspath(path)).is_relative_to(os.path.abspath(self.directory))
        if inside and not path.resolve().is_relative_to(Path(self.directory).resolve()):
            self.send_error(404, "no such page")  # a symbolic link in the site that leads out of it
            return None
        if path.is_dir() and not (path / "index.html").is_file():
            self.send_error(404, "no such page")  # never a directory listing
            return None
        return super().send_head()

    def _same_origin(self):
        return (self.headers.get("Sec-Fetch-Site") == "same-origin"
                and self.headers.get("Origin") in (None, self.gate.origin)
                and (self.command == "GET" or self.headers.get("Origin") == self.gate.origin))

    def _answer(self, status, answer):
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _let_in(self):
        """This request's session if it carries a live one from a page of this origin; else None, answered 403."""
        session = self.headers.get(SESSION_HEADER)
        if not self.gate.admits(session):
            ended = self.gate.ended(session)  # "idle" or "lifetime": the page asks for a new link
            self._answer(403, {"refused": "this tab has not opened the link `make serve` printed",
                               **({"ended": ended} if ended else {})})
            return None
        if not self._same_origin():
            self._answer(403, {"refused": "same-origin requests only"})
            return None
        self.server.with_session(self.connection)
        return session

    def _config(self):
        if self._let_in() is None:
            return None
        return self._answer(200, {"base_url": f"{self.gate.origin}/_live/"})

    def _release(self, body):
        """Delete the kernel named in `body` (``{"kernel": id}``) for a page that is closing."""
        if self._let_in() is None:
            return None
        try:
            kernel = json.loads(body)["kernel"]
        except (ValueError, KeyError, TypeError):
            kernel = None
        if not isinstance(kernel, str) or not KERNEL_ID.fullmatch(kernel):
            return self._answer(400, {"refused": "a kernel id expected"})
        return self._delete(self.headers.get(SESSION_HEADER), kernel)

    def _delete(self, session, kernel):
        if not self.gate.admits(session, kernel):
            return self._answer(404, {"message": "no such kernel of this session"})
        status, _ = self.kernel_server.request("DELETE", f"/api/kernels/{kernel}", timeout=30)
        self.gate.disown(kernel)
        return self._answer(200 if status in (204, 404) else 502, {"kernel": kernel, "kernel_server": status})

    def _kernels(self, path, body):
        """The kernels' API under `KERNELS_PATH`, passed on to the kernel server for a session's own kernels."""
        route = next(((what, found) for (method, pattern), what in KERNEL_ROUTES.items()
                      if method == self.command and (found := pattern.fullmatch(path[len(KERNELS_PATH):]))), None)
        if route is None or self.kernel_server is None:
            return self._answer(404, {"message": "not a kernel request this server passes on"})
        what, found = route
        kernel = found.group(1) if found.groups() else None
        if what == "channels":
            return self._channels(kernel)
        session = self._let_in()
        if session is None:
            return None
        if what == "start":
            status, answer = self.kernel_server.request("POST", "/api/kernels", body=b'{"name": "python3"}')
            if status == 201:
                started = json.loads(answer)["id"]
                if not self.gate.adopt(session, started):  # the session expired while the kernel started
                    self.kernel_server.delete([started])
                    return self._answer(403, {"refused": "this session expired"})
        elif what == "delete":
            return self._delete(session, kernel)
        else:
            if not self.gate.admits(session, kernel):
                return self._answer(404, {"message": "no such kernel of this session"})
            status, answer = self.kernel_server.request("POST", f"/api/kernels/{kernel}/restart", body=b"{}")
        try:
            found = json.loads(answer) if answer else {}
        except ValueError:
            found = {}
        return self._answer(status, {key: found[key] for key in ("id", "name", "message") if key in found})

    def _channels(self, kernel):
        """Open `kernel`'s WebSocket for a page of this origin whose handshake offers its session."""
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        session = next((p.removeprefix(SESSION_PROTOCOL) for p in offered if p.startswith(SESSION_PROTOCOL)), None)
        key = self.headers.get("Sec-WebSocket-Key", "")
        if (self.headers.get("Upgrade", "").lower() != "websocket" or self.headers.get("Sec-WebSocket-Version") != "13"
                or not re.fullmatch(r"[A-Za-z0-9+/]{22}==", key) or SUBPROTOCOL not in offered):
            return self._answer(400, {"refused": "a WebSocket handshake expected"})
        if self.headers.get("Origin") != self.gate.origin or not self.gate.admits(session, kernel):
            return self._answer(403, {"refused": "this tab has no session for this kernel"})
        query = urllib.parse.parse_qs(self.path.partition("?")[2])
        session_id = query.get("session_id", [""])[0]
        query = f"?session_id={session_id}" if re.fullmatch(r"[\w-]{1,64}", session_id) else ""
        upstream, rest = self.kernel_server.open_channels(kernel, query, key)
        if upstream is None:
            return self._answer(502 if rest == 502 else 404, {"refused": "the kernel's channels could not be opened"})
        try:
            if not self.gate.track(session, self.connection):
                return self._answer(403, {"refused": "this session expired"})
            accept = base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()).decode()
            self.send_response(101)
            for name, value in (("Upgrade", "websocket"), ("Connection", "Upgrade"),
                                ("Sec-WebSocket-Accept", accept), ("Sec-WebSocket-Protocol", SUBPROTOCOL)):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(rest)
            self.close_connection = True
            self.server.with_session(self.connection)
            frames = ClientFrames()  # only the reader's messages to the kernel count as use, not pongs
            splice(self.connection, upstream, lambda chunk: self.gate.admits(session, kernel, frames.feed(chunk)))
        finally:
            self.gate.untrack(session, self.connection)
            upstream.close()
        return None

    def cache_control(self):
        # The session answers and the kernels' API: never stored.
        return "no-store" if (self.path or "").startswith("/_live/") else super().cache_control()


def scratch_root(repository: Path, into: Path) -> Path:
    """`into`, holding read-only copies of the repository's `RUNTIME_FILES` at the same relative places."""
    for name in RUNTIME_FILES:
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (repository / name).is_file():
            shutil.copyfile(repository / name, target)
            target.chmod(0o444)
    (into / KERNEL_FOLDER).mkdir(parents=True, exist_ok=True)
    return into


def kernel_spec(into: Path) -> Path:
    """`into`, a Jupyter data folder whose ``kernels/python3`` spec runs ``_live_kernel.py``, which opens no TCP
    port (ipykernel's own launcher opens one for its subprocesses' output), and keeps its history in memory."""
    spec = into / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(HERE / "_live_kernel.py"), "-f", "{connection_file}",
                 "--HistoryManager.hist_file=:memory:"],
        "display_name": "Python 3 (make serve)", "language": "python", "metadata": {"debugger": False},
    }))
    return into


def private_environment(run_dir: Path) -> dict:
    """The environment of the kernel server and its kernels: no credential of the parent's, and every folder
    they would write to (home, temporary, IPython's, matplotlib's, Jupyter's) inside `run_dir`."""
    env = {name: value for name, value in os.environ.items()
           if name not in SECRET_VARIABLES and name not in PRIVATE_FOLDERS}
    env["HOME"] = str(run_dir / "home")
    env["TMPDIR"] = str(run_dir / "tmp")  # jupyter_core's jupyter-clean-cfg-* folder among others
    for name in ("HOME", "TMPDIR"):
        Path(env[name]).mkdir(mode=0o700)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["JUPYTER_NO_CONFIG"] = "1"  # no user or system configuration, so no server extensions
    env["JUPYTER_RUNTIME_DIR"] = str(run_dir / "runtime")  # socket, connection files: this run's
    env["JUPYTER_PATH"] = str(kernel_spec(run_dir))  # its kernels/python3 comes first: _live_kernel.py
    return env


class LiveServer:
    """The book at `site` on 127.0.0.1:`port` with a kernel server behind it, on a Unix socket.

    `announce(text)` is called with each notice for the terminal (a link used or expired, a session ended, a
    misbehaving client). Each link is also written to `link_file`, the page (mode 0600, in the run's private
    folder) whose ``file://`` address the terminal shows. The limits (`link_seconds`, `session_idle`,
    `session_lifetime`, `kernel_idle`, `max_kernels`, `read_timeout`, `idle_without_session`,
    `request_deadline`, `max_connections`) default to the module's constants; the tests shorten them."""

    def __init__(self, site, port=0, root=ROOT, handler=BookHandler, announce=None,
                 link_seconds=LINK_SECONDS, session_idle=SESSION_IDLE_SECONDS, kernel_idle=KERNEL_IDLE_SECONDS,
                 max_kernels=MAX_KERNELS, read_timeout=READ_TIMEOUT, request_deadline=REQUEST_DEADLINE,
                 max_connections=MAX_CONNECTIONS, session_lifetime=SESSION_LIFETIME_SECONDS,
                 idle_without_session=IDLE_WITHOUT_SESSION):
        self.site = Path(site)
        if not (self.site / "index.html").is_file():
            raise FileNotFoundError(f"no built book in {self.site} (run `make docs`)")
        self.token = secrets.token_urlsafe(32)
        handler = type("Handler", (handler,), {"timeout": read_timeout, "request_deadline": request_deadline,
                                               "idle_without_session": idle_without_session})
        self.httpd = BookServer((HOST, port), functools.partial(handler, directory=str(self.site)), max_connections,
                                announce)
        self.run_dir = Path(tempfile.mkdtemp(prefix="ar-live-"))  # mode 0700: this user's only
        self.link_file = self.run_dir / "open-live-code.html"
        self.gate = handler.gate = Gate(self.httpd.server_address[1], announce, link_seconds, session_idle,
                                        on_expire=self._expired, session_lifetime=session_lifetime,
                                        link_file=self.link_file)
        self.url = f"{self.gate.origin}/"
        self.origin = self.gate.origin
        self.root = Path(root)
        self.limits = {"kernel_idle": kernel_idle, "max_kernels": max_kernels}
        self.runtime_dir = self.run_dir / "runtime"  # the kernel server's socket, connection files, IPC sockets
        self.kernel_socket = self.runtime_dir / "kernels.sock"
        self.kernel_server = handler.kernel_server = KernelServer(self.kernel_socket, self.token, self.origin)
        self.log = open(self.run_dir / "kernel-server.log", "w")  # closed by stop()
        self.process = None
        self.stopped = threading.Event()

    def new_link(self) -> str:
        """A fresh one-time link that lets one browser tab in (the one before it stops working), also written to
        `link_file`: a program's business only, never to be printed or given to a browser as an argument."""
        return self.gate.new_link()

    def _expired(self, kernels, connections):
        """An expired session's WebSockets are closed now, its kernels shut down in the background."""
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        threading.Thread(target=self.kernel_server.delete, args=(kernels,), daemon=True).start()

    def _sweep(self):
        """Expire idle sessions even when no request comes (their kernels then go at once)."""
        while not self.stopped.wait(max(0.5, min(30.0, self.gate.session_idle / 4))):
            self.gate.sweep()

    def start(self, timeout=60):
        self.runtime_dir.mkdir(mode=0o700)
        env = private_environment(self.run_dir)
        scratch = scratch_root(self.root, self.run_dir / "scratch")
        self.process = subprocess.Popen(
            [
                sys.executable, "-c", "import _live_server; _live_server.serve_kernels()",
                f"--ServerApp.sock={self.kernel_socket}",
                "--ServerApp.sock_mode=0600",
                "--ServerApp.open_browser=False",
                f"--ServerApp.allow_origin={self.origin}",
                f"--ServerApp.root_dir={scratch}",
                "--ServerApp.terminals_enabled=False",
                "--ServerApp.disable_check_xsrf=True",  # the token in a header is the check; no _xsrf cookie
                "--ServerApp.identity_provider_class=_live_server.TokenOnlyIdentityProvider",
                "--ServerApp.kernel_manager_class=_live_server.LiveKernelManager",
                "--ServerApp.contents_manager_class=_live_server.NoFilesContentsManager",
                "--KernelManager.transport=ipc",  # kernels on Unix sockets in the runtime folder, not TCP ports
                f"--LiveKernelManager.max_kernels={self.limits['max_kernels']}",
                f"--LiveKernelManager.cull_idle_timeout={self.limits['kernel_idle']}",
                f"--LiveKernelManager.cull_interval={max(1, min(60, self.limits['kernel_idle'] // 2))}",
                "--LiveKernelManager.cull_connected=False",  # a page's open kernel stays
                *(["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []),  # CI and containers run as root
            ],
            env=env, cwd=self.run_dir, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # Ctrl-C reaches this process only; it stops the kernel server cleanly
        )
        self.process.stdin.write(self.token + "\n")  # the token; the pipe stays open while this process runs
        self.process.stdin.flush()
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        threading.Thread(target=self._sweep, daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the kernel server stopped (exit {self.process.returncode}): "
                                   f"{Path(self.log.name).read_text()[-2000:]}")
            if self.kernel_socket.is_socket() and self.kernel_server.request("GET", "/api/status", timeout=2)[0] == 200:
                return self
            if time.monotonic() > deadline:
                log = Path(self.log.name).read_text()[-2000:]
                self.stop()
                raise RuntimeError(f"the kernel server did not start in {timeout} s: {log}")
            time.sleep(0.2)

    def stop(self):
        self.stopped.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.process and self.process.poll() is None:
            self.process.terminate()  # jupyter_server shuts its kernels down on SIGTERM
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process:
            self.process.stdin.close()
        self.log.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)  # the log, sockets, scratch, home and temporary folders

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _say(text):
    """Print `text` for the terminal, which may be gone (a hang-up): then say nothing."""
    try:
        print(text, flush=True)
    except (OSError, ValueError):
        pass


def _print_link(server):
    """Write a new link into the server's link file and show how to open it: the terminal never shows a URL
    that carries a key (a browser started on one would show the key to every local user in its command line)."""
    server.new_link()
    _say(f"For live code, open {server.link_file.as_uri()} in your browser (Ctrl+click it, or paste it into the "
         f"address bar): a page only you can read, which takes one browser tab in, once, within "
         f"{server.gate.link_seconds:g} s.\nPress Enter here for a new one.")


def _links_on_enter(server):
    """Write a new link each time Enter is pressed in the terminal (until standard input ends)."""
    for _ in sys.stdin:
        _print_link(server)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "docs" / "_build" / "html"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
    parser.add_argument("--link-seconds", type=float, default=LINK_SECONDS,
                        help=f"how long an unused link works (default {LINK_SECONDS})")
    parser.add_argument("--session-idle", type=float, default=SESSION_IDLE_SECONDS,
                        help=f"how long a session the reader leaves unused lasts (default {SESSION_IDLE_SECONDS})")
    parser.add_argument("--session-lifetime", type=float, default=SESSION_LIFETIME_SECONDS,
                        help=f"how long any session lasts (default {SESSION_LIFETIME_SECONDS})")
    args = parser.parse_args(argv)
    # Ctrl-C, a plain kill and a hang-up (the terminal closed) stop both servers and delete the run's folder,
    # even where the shell started this with SIGINT ignored.
    stops = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # started with nohup: a hang-up does not stop it
        stops.append(signal.SIGHUP)
    for number in stops:
        signal.signal(number, signal.default_int_handler)

    server = LiveServer(args.site, args.port, announce=_say, link_seconds=args.link_seconds,
                        session_idle=args.session_idle, session_lifetime=args.session_lifetime)
    _say(f"starting the kernel server (log, deleted at stop: {server.log.name})...")
    with server:
        _say(f"The book: {server.url}  (Ctrl-C stops the book and its kernel server)")
        _print_link(server)
        threading.Thread(target=_links_on_enter, args=(server,), daemon=True).start()
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            for number in stops:  # a second signal does not cut the cleanup short
                signal.signal(number, signal.SIG_IGN)
            _say("\nstopping...")


if __name__ == "__main__":
    main()

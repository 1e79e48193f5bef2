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
  - at most ``MAX_CONNECTIONS`` connections at a time (one more gets 503 at once, before anything is read); a
    request must arrive whole (request line, headers, body) within ``REQUEST_DEADLINE`` seconds of the
    connection's wait for it, however slowly it trickles in, and a silent connection is closed after
    ``READ_TIMEOUT`` seconds;
  - neither server sets a cookie, and no cookie is a credential. A browser sends every cookie of ``127.0.0.1`` to
    every port of it, and so to any other local user's server there, which can replay it. The link ``make serve``
    prints, ``http://127.0.0.1:PORT/#live-key=K``, carries a one-time key in its fragment, which the browser
    never sends anywhere. The page's script (``_static/live_code.js``) removes it from the address and trades it,
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
  - a key works once and expires unused after ``LINK_SECONDS``; after a use or an expiry the terminal gets a
    notice, not a fresh link: pressing Enter there prints a new one. A session expires after
    ``SESSION_IDLE_SECONDS`` without a request or a message to a kernel; then its requests get 403 at once, its
    WebSockets are closed and its kernels are shut down.

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

Ctrl-C stops both. Relies on jupyter_server's ``IdentityProvider`` (``get_user``, ``get_user_cookie``,
``set_login_cookie``, ``auth_header_pat``), ``AsyncMappingKernelManager.start_kernel``,
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
import selectors
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
LINK_FRAGMENT = "live-key"
HOST = "127.0.0.1"
MAX_TARGET = 2048  # characters of a request target; the book's longest URL is far shorter
MAX_BODY = 1024  # bytes of a POST body (a kernel id)
READ_TIMEOUT = 30  # s a connection may stay silent before the book server closes it
REQUEST_DEADLINE = 20  # s for a whole request to arrive, counted from when the server starts waiting for it
MAX_CONNECTIONS = 64  # connections to the book server at a time (a tab opens up to 6, a kernel's WebSocket 1)
UPSTREAM_TIMEOUT = 120  # s the book server waits for the kernel server (a restart waits for the kernel)
LINK_SECONDS = 300  # an unused link expires after 5 minutes
SESSION_IDLE_SECONDS = 2 * 3600  # a session unused for 2 hours expires
KERNEL_IDLE_SECONDS = 1800  # a kernel idle for 30 minutes with no page connected is shut down
MAX_KERNELS = 8  # kernels at a time (each about 50 MB)
KERNEL_FOLDER = "docs/chapters"  # every kernel's working folder, in the scratch copy of the repository
KERNEL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The kernels' API as the book server passes it on: (method, path after KERNELS_PATH) -> what it is.
KERNEL_ROUTES = {("POST", re.compile(r"/?")): "start", ("POST", re.compile(rf"/({KERNEL_ID.pattern})/restart")):
                 "restart", ("DELETE", re.compile(rf"/({KERNEL_ID.pattern})")): "delete",
                 ("GET", re.compile(rf"/({KERNEL_ID.pattern})/channels")): "channels"}
SECURITY_HEADERS = (("Content-Security-Policy", "frame-ancestors 'none'"), ("X-Frame-Options", "DENY"))
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
    No handler of this process sets a cookie (jupyter_server's pages and errors would set ``_xsrf``)."""
    from traitlets.config import Config

    token = sys.stdin.readline().strip()
    if not token:
        raise SystemExit("_live_server.serve_kernels: no token on standard input")
    web.RequestHandler.set_cookie = lambda self, name, value, *args, **kwargs: None
    KernelServerApp.launch_instance(argv, config=Config({"IdentityProvider": {"token": token}}))


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


class Gate:
    """Who may use the kernels: a page of this server's origin holding a session, which it got for a one-time
    key (in a link's fragment, so sent nowhere but by that page's script); each session reaches the kernels it
    started.

    `announce(text)` is called with each line for the terminal: a new link, a link used, a link expired.
    `on_expire(kernels, connections)` is called (outside the lock) with what an expired session held.
    `clock` is a monotonic clock in seconds (the tests pass their own)."""

    def __init__(self, port, announce=None, link_seconds=LINK_SECONDS, session_idle=SESSION_IDLE_SECONDS,
                 clock=time.monotonic, on_expire=None):
        self.port = port
        self.origin = f"http://{HOST}:{port}"
        self.hosts = {f"{HOST}:{port}": "here", f"localhost:{port}": "redirect"}
        self.announce = announce or (lambda text: None)
        self.on_expire = on_expire or (lambda kernels, connections: None)
        self.link_seconds, self.session_idle, self.clock = link_seconds, session_idle, clock
        self.sessions: dict[str, float] = {}  # session -> when it was last used
        self.kernels: dict[str, str] = {}  # kernel id -> the session that started it
        self.connections: dict[str, set] = {}  # session -> its open WebSocket connections (sockets)
        self.lock = threading.Lock()
        self.key: str | None = None
        self.key_expires = 0.0

    def new_link(self) -> str:
        """A fresh one-time link (the previous one stops working); it expires unused after `link_seconds`."""
        with self.lock:
            self.key = key = secrets.token_urlsafe(32)
            self.key_expires = self.clock() + self.link_seconds
        timer = threading.Timer(self.link_seconds, self._expired, (key,))
        timer.daemon = True
        timer.start()
        return f"{self.origin}/#{LINK_FRAGMENT}={key}"

    def _expired(self, key):
        with self.lock:
            if self.key != key:
                return  # used, or replaced by a newer link
            self.key = None
        self.announce(f"The live-code link expired unused ({self.link_seconds:g} s). Press Enter for a new one.")

    def redeem(self, key: str | None) -> str | None:
        """A new session for the current, unexpired `key` (which is then spent), else None."""
        with self.lock:
            if not (key and self.key and self.clock() < self.key_expires
                    and secrets.compare_digest(key.encode(), self.key.encode())):
                return None
            self.key = None
            session = secrets.token_urlsafe(32)
            self.sessions[session] = self.clock()
        self.announce(f"The live-code link was used at {time.strftime('%H:%M:%S')}; it works no more. "
                      "For another browser or tab, press Enter here for a new link.")
        return session

    def sweep(self):
        """Forget the sessions idle for over `session_idle` seconds, and hand what they held to `on_expire`."""
        with self.lock:
            now = self.clock()
            gone = {known for known, used in self.sessions.items() if now - used > self.session_idle}
            for session in gone:
                del self.sessions[session]
            kernels = [kernel for kernel, owner in self.kernels.items() if owner in gone]
            for kernel in kernels:
                del self.kernels[kernel]
            connections = [c for session in gone for c in self.connections.pop(session, ())]
        if kernels or connections:
            self.on_expire(kernels, connections)
        if gone:
            self.announce(f"A live-code session expired unused ({self.session_idle:g} s); its "
                          f"{len(kernels)} kernel(s) are shut down. Press Enter for a new link.")

    def _known(self, session):
        """`session` if it is live (call with the lock held), else None."""
        return next((known for known in self.sessions
                     if session and secrets.compare_digest(session.encode(), known.encode())), None)

    def admits(self, session: str | None, kernel: str | None = None) -> bool:
        """Whether `session` is live (then its idle time starts again), and started `kernel` if one is named;
        expired sessions are forgotten first."""
        self.sweep()
        with self.lock:
            known = self._known(session)
            if known is None or (kernel is not None and self.kernels.get(kernel) != known):
                return False
            self.sessions[known] = self.clock()
            return True

    def adopt(self, session: str, kernel: str) -> bool:
        """Record that `session` started `kernel`; False if the session expired meanwhile."""
        with self.lock:
            if self._known(session) is None:
                return False
            self.kernels[kernel] = session
            return True

    def disown(self, kernel: str):
        with self.lock:
            self.kernels.pop(kernel, None)

    def track(self, session: str, connection) -> bool:
        """Count `connection` (a WebSocket) as `session`'s until `untrack`; False if the session is gone."""
        with self.lock:
            if self._known(session) is None:
                return False
            self.connections.setdefault(session, set()).add(connection)
            return True

    def untrack(self, session: str, connection):
        with self.lock:
            self.connections.get(session, set()).discard(connection)


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


def _splice(client, upstream, on_client_data):
    """Pass bytes both ways between two sockets until either side closes; `on_client_data()` after each of the
    client's chunks."""
    client.settimeout(None)
    with selectors.DefaultSelector() as selector:
        selector.register(client, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, client)
        while True:
            for found, _ in selector.select():
                try:
                    data = found.fileobj.recv(65536)
                    if data:
                        found.data.sendall(data)
                except OSError:
                    data = b""
                if not data:
                    return
                if found.fileobj is client:
                    on_client_data()


class _DeadlineReader(socket.SocketIO):
    """A connection's reading end that gives up when `handler.deadline` (monotonic seconds, None: no deadline)
    has passed, however the bytes trickle in."""

    def __init__(self, sock, handler):
        super().__init__(sock, "rb")
        self.handler = handler

    def readinto(self, buffer):
        deadline = self.handler.deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive within its deadline")
            self._sock.settimeout(min(left, self.handler.timeout))
        return super().readinto(buffer)


class BookHandler(StaticHandler):
    """The built book, answering only its own origin, plus ``/_live/`` for pages holding a session."""

    gate: ClassVar[Gate]
    kernel_server: ClassVar[KernelServer | None] = None  # set per server
    timeout = READ_TIMEOUT  # socketserver's per-connection read timeout
    request_deadline = REQUEST_DEADLINE
    deadline = None  # when the request being read must have arrived (monotonic s), None once it has

    def setup(self):
        super().setup()
        self.rfile.close()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))

    def handle_one_request(self):
        self.deadline = time.monotonic() + self.request_deadline
        try:
            super().handle_one_request()
        finally:
            self._arrived()

    def _arrived(self):
        """The request has been read: no deadline, the usual read timeout again."""
        if self.deadline is not None:
            self.deadline = None
            self.connection.settimeout(self.timeout)

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
            session = self.gate.redeem(self.headers.get(KEY_HEADER))
            if session is None:
                return self._answer(403, {"refused": "this link is not valid, expired or was already used"})
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
            self._answer(403, {"refused": "this tab has not opened the link `make serve` printed"})
            return None
        if not self._same_origin():
            self._answer(403, {"refused": "same-origin requests only"})
            return None
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
            _splice(self.connection, upstream, lambda: self.gate.admits(session, kernel))
        finally:
            self.gate.untrack(session, self.connection)
            upstream.close()
        return None

    def cache_control(self):
        # The session answers and the kernels' API: never stored.
        return "no-store" if self.path.startswith("/_live/") else super().cache_control()


BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n"
        b"Connection: close\r\nCache-Control: no-store\r\nRetry-After: 1\r\n"
        + b"".join(f"{name}: {value}\r\n".encode() for name, value in SECURITY_HEADERS) + b"\r\nserver busy.\n")


class BookServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at a time: one more gets `BUSY` at once and is
    closed. Quiet about clients that go away or miss their deadline."""

    daemon_threads = True

    def __init__(self, address, handler, max_connections=MAX_CONNECTIONS):
        super().__init__(address, handler)
        self.max_connections = max_connections
        self.active = 0
        self.count_lock = threading.Lock()

    def process_request(self, request, client_address):
        with self.count_lock:
            full = self.active >= self.max_connections
            self.active += not full
        if full:
            try:
                request.settimeout(1)
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self.count_lock:
                self.active -= 1
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.count_lock:
                self.active -= 1

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


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

    `announce(text)` is called with each notice for the terminal (a link used or expired, a new link).
    The limits (`link_seconds`, `session_idle`, `kernel_idle`, `max_kernels`, `read_timeout`, `request_deadline`,
    `max_connections`) default to the module's constants; the tests shorten them."""

    def __init__(self, site, port=0, root=ROOT, handler=BookHandler, announce=None,
                 link_seconds=LINK_SECONDS, session_idle=SESSION_IDLE_SECONDS, kernel_idle=KERNEL_IDLE_SECONDS,
                 max_kernels=MAX_KERNELS, read_timeout=READ_TIMEOUT, request_deadline=REQUEST_DEADLINE,
                 max_connections=MAX_CONNECTIONS):
        self.site = Path(site)
        if not (self.site / "index.html").is_file():
            raise FileNotFoundError(f"no built book in {self.site} (run `make docs`)")
        self.token = secrets.token_urlsafe(32)
        handler = type("Handler", (handler,), {"timeout": read_timeout, "request_deadline": request_deadline})
        self.httpd = BookServer((HOST, port), functools.partial(handler, directory=str(self.site)), max_connections)
        self.gate = handler.gate = Gate(self.httpd.server_address[1], announce, link_seconds, session_idle,
                                        on_expire=self._expired)
        self.url = f"{self.gate.origin}/"
        self.origin = self.gate.origin
        self.root = Path(root)
        self.limits = {"kernel_idle": kernel_idle, "max_kernels": max_kernels}
        self.run_dir = Path(tempfile.mkdtemp(prefix="ar-live-"))  # mode 0700: this user's only
        self.runtime_dir = self.run_dir / "runtime"  # the kernel server's socket, connection files, IPC sockets
        self.kernel_socket = self.runtime_dir / "kernels.sock"
        self.kernel_server = handler.kernel_server = KernelServer(self.kernel_socket, self.token, self.origin)
        self.log = open(self.run_dir / "kernel-server.log", "w")  # closed by stop()
        self.process = None
        self.stopped = threading.Event()

    def new_link(self) -> str:
        """A fresh one-time link that lets one browser tab in (the one before it stops working)."""
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
        self.process.stdin.write(self.token + "\n")
        self.process.stdin.close()
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
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)  # the log, sockets, scratch, home and temporary folders

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _print_link(server):
    print(f"For live code, open this link (it works once, in one browser tab, for {server.gate.link_seconds:g} "
          f"s): {server.new_link()}\nPress Enter here for a new link.", flush=True)


def _links_on_enter(server):
    """Print a new link each time Enter is pressed in the terminal (until standard input ends)."""
    for _ in sys.stdin:
        _print_link(server)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "docs" / "_build" / "html"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
    parser.add_argument("--link-seconds", type=float, default=LINK_SECONDS,
                        help=f"how long an unused link works (default {LINK_SECONDS})")
    parser.add_argument("--session-idle", type=float, default=SESSION_IDLE_SECONDS,
                        help=f"how long an unused session lasts (default {SESSION_IDLE_SECONDS})")
    args = parser.parse_args(argv)
    # Ctrl-C (and a plain kill) stop both servers, even where the shell started this with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    def announce(text):
        print(text, flush=True)

    server = LiveServer(args.site, args.port, announce=announce, link_seconds=args.link_seconds,
                        session_idle=args.session_idle)
    print(f"starting the kernel server (log, deleted at stop: {server.log.name})...", flush=True)
    with server:
        print(f"The book: {server.url}  (Ctrl-C stops the book and its kernel server)", flush=True)
        _print_link(server)
        threading.Thread(target=_links_on_enter, args=(server,), daemon=True).start()
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("\nstopping...", flush=True)


if __name__ == "__main__":
    main()

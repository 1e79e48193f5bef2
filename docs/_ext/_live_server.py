"""``make serve``: the built book on 127.0.0.1 with a Jupyter kernel server beside it, for the pages' live code.

Not a Sphinx extension: the program ``make serve`` runs (``python docs/_ext/_live_server.py docs/_build/html``),
and the code tests/test_live.py starts on free ports. Everything of a run lives in one private folder (mode
0700, ``ar-live-*`` in the temporary folder), deleted when it stops: the kernel server's log, its runtime folder
(connection files and the kernels' IPC sockets) and the kernels' scratch working folder. Two servers, both bound
to 127.0.0.1, and no other TCP port:

* the book, as a static host serves it, with these locks:

  - every request must name this server in ``Host`` (``127.0.0.1:PORT``; ``localhost:PORT`` is redirected there,
    the one origin the kernel server accepts): any other name gets 421, so a DNS-rebinding page learns nothing;
  - a request target that is not a clean path (NUL or control characters, bad percent-encoding, over
    ``MAX_TARGET`` characters, absolute form) gets 400; a folder without an ``index.html`` gets 404, not a
    listing; a symbolic link that leads out of the site gets 404; a connection that sends nothing for
    ``READ_TIMEOUT`` seconds is closed;
  - no cookie is a credential. A browser sends every cookie of ``127.0.0.1`` to every port of it, and so to any
    other local user's server there, which can replay it. The link ``make serve`` prints,
    ``http://127.0.0.1:PORT/#live-key=K``, carries a one-time key in its fragment, which the browser never sends
    anywhere. The page's script (``_static/live_code.js``) removes it from the address and trades it, in a
    same-origin ``POST /_live/session`` with the key in the ``X-Live-Key`` header, for a session secret that it
    keeps in ``sessionStorage``: storage of this origin (scheme, host and port), which no page of another port
    can read. ``GET /_live/config.json`` (the kernel server's address and token) answers only a request that
    carries a live session in the ``X-Live-Session`` header and is marked ``Sec-Fetch-Site: same-origin``;
    anything else gets 403, and the pages still read normally. A page of another origin cannot send that
    header without a CORS preflight, which this server never grants.
  - ``POST /_live/release`` (same session header) deletes a kernel: the page sends it with ``keepalive`` when it
    is hidden for good (``pagehide``), a same-origin request that needs no preflight.
  - a key works once and expires unused after ``LINK_SECONDS``; after a use or an expiry the terminal gets a
    notice, not a fresh link: pressing Enter there prints a new one. A session expires after
    ``SESSION_IDLE_SECONDS`` without a request.

* jupyter_server (the ``live`` extra), with a random token, ``allow_origin`` set to the book's origin, no
  configuration files or server extensions (``JUPYTER_NO_CONFIG``), and only the ``api`` and ``kernels``
  services: no contents, files (``/files/`` is not routed), sessions, terminals or nbconvert. Its identity
  provider takes the token from the ``Authorization`` header (or, on a WebSocket handshake, where a browser
  cannot set that header, from the ``token`` query argument), checks every request's origin, and neither sets
  nor reads a cookie: jupyter_server's default sets a host-wide login cookie, valid for 30 days, that any other
  port of 127.0.0.1 receives. The token is handed over on standard input and written to no file (the server's
  ``jpserver-*.json`` and ``-open.html`` files are not written). Kernels talk to it over IPC sockets in the
  private runtime folder, not TCP ports, and are ``_live_kernel.py`` (the one kernel spec), which opens no TCP
  port either; each starts in the scratch folder's ``KERNEL_FOLDER`` (the client's kernel ``name``, ``path`` and
  ``kernel_id`` are ignored), at most ``MAX_KERNELS`` at a time (one more gets 429 and a message
  the page shows), and one idle for ``KERNEL_IDLE_SECONDS`` without a page connected is shut down. The scratch
  folder mirrors the repository's layout with copies of the files the chapters read while they run
  (``RUNTIME_FILES``: the figure style, the frameworks record, the benchmark record), so a reader's code writes
  there, not into the repository.

What this does not stop: the browser tab that traded a link for a session (and anything that takes over that
browser) can run code as the user who started the server, until the session expires or the server stops; so can
the user's own processes and root, which can read everything anyway.

Ctrl-C stops both. Relies on jupyter_server's ``IdentityProvider`` (``get_user``, ``get_user_cookie``,
``set_login_cookie``, ``auth_header_pat``), ``AsyncMappingKernelManager.start_kernel``,
``ContentsManager.get_extra_handlers``, ``ServerApp.write_server_info_file``/``write_browser_open_files`` and
``ServerApp.default_services``, checked when the kernel server imports this module. Verified with
jupyter_server 2.21.1, jupyter_client 8.10.0, ipykernel 7.4.0 and tornado 6.6.1.
"""

from __future__ import annotations

import argparse
import functools
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
SESSION_PATH = "/_live/session"
RELEASE_PATH = "/_live/release"
KEY_HEADER = "X-Live-Key"
SESSION_HEADER = "X-Live-Session"
LINK_FRAGMENT = "live-key"
HOST = "127.0.0.1"
MAX_TARGET = 2048  # characters of a request target; the book's longest URL is far shorter
MAX_BODY = 1024  # bytes of a POST body (a kernel id)
READ_TIMEOUT = 30  # s a connection may stay silent before the book server closes it
LINK_SECONDS = 300  # an unused link expires after 5 minutes
SESSION_IDLE_SECONDS = 2 * 3600  # a session unused for 2 hours expires
KERNEL_IDLE_SECONDS = 1800  # a kernel idle for 30 minutes with no page connected is shut down
MAX_KERNELS = 8  # kernels at a time (each about 50 MB)
KERNEL_FOLDER = "docs/chapters"  # every kernel's working folder, in the scratch copy of the repository
KERNEL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# What the chapters read while they run, relative to the repository (and so to the kernels' scratch root):
# docs/chapters/matplotlibrc (the figure style, read from the working folder), frameworks.md's record,
# performance.md's ../../benchmarks/results.json.
RUNTIME_FILES = ("docs/chapters/matplotlibrc", "docs/chapters/frameworks_record.json", "benchmarks/results.json")
# The client's services only: /api/status, the kernels' REST API and their WebSocket channels.
KERNEL_SERVICES = ("api", "kernels")
# Credentials a parent environment may carry that must not reach the kernel server or its kernels.
SECRET_VARIABLES = ("JUPYTER_TOKEN", "JUPYTER_TOKEN_FILE", "JUPYTER_PASSWORD")

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
    if not set(KERNEL_SERVICES) <= set(ServerApp.default_services):
        raise RuntimeError(f"jupyter_server's ServerApp.default_services {ServerApp.default_services} lacks "
                           f"{KERNEL_SERVICES}; _live_server.py needs updating")

    class TokenOnlyIdentityProvider(IdentityProvider):
        """The token, compared in constant time, is the only credential: no cookie is written or read, every
        request's ``Origin`` is checked against ``allow_origin``, and there is no login or logout page."""

        reader = User(username="reader", name="reader", display_name="reader")

        def get_user(self, handler):
            found = self.auth_header_pat.match(handler.request.headers.get("Authorization", ""))
            supplied = found.group(2) if found else ""
            if not supplied and handler.request.headers.get("Upgrade", "").lower() == "websocket":
                supplied = handler.get_query_argument("token", "")  # a browser's WebSocket sends no headers
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
    """Who may read the kernel server's token: a page of this server's origin holding a session, which it got
    for a one-time key (in a link's fragment, so sent nowhere but by that page's script).

    `announce(text)` is called with each line for the terminal: a new link, a link used, a link expired.
    `clock` is a monotonic clock in seconds (the tests pass their own)."""

    def __init__(self, port, announce=None, link_seconds=LINK_SECONDS, session_idle=SESSION_IDLE_SECONDS,
                 clock=time.monotonic):
        self.port = port
        self.origin = f"http://{HOST}:{port}"
        self.hosts = {f"{HOST}:{port}": "here", f"localhost:{port}": "redirect"}
        self.announce = announce or (lambda text: None)
        self.link_seconds, self.session_idle, self.clock = link_seconds, session_idle, clock
        self.sessions: dict[str, float] = {}  # session -> when it was last used
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

    def admits(self, session: str | None) -> bool:
        """Whether `session` is live (then its idle time starts again); expired sessions are forgotten."""
        with self.lock:
            now = self.clock()
            for known, used in list(self.sessions.items()):
                if now - used > self.session_idle:
                    del self.sessions[known]
            match = next((known for known in self.sessions
                          if session and secrets.compare_digest(session.encode(), known.encode())), None)
            if match is not None:
                self.sessions[match] = now
            return match is not None


class BookHandler(StaticHandler):
    """The built book, answering only its own origin, plus ``/_live/`` for pages holding a session."""

    live: ClassVar[dict] = {}  # set per server: base_url, token
    gate: ClassVar[Gate]
    timeout = READ_TIMEOUT  # socketserver's per-connection read timeout

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
        if where == "redirect":  # the kernel server accepts one origin, and page storage is per origin
            self.send_response(307)
            self.send_header("Location", self.gate.origin + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        return True

    def do_GET(self):
        if self.path.partition("?")[0] == CONFIG_PATH:
            return self._config()
        return super().do_GET()

    def do_POST(self):
        path = self.path.partition("?")[0]
        if path not in (SESSION_PATH, RELEASE_PATH):
            return self.send_error(405, "the book is read-only")
        length = self.headers.get("Content-Length", "0")
        if not length.isdigit() or int(length) > MAX_BODY:
            return self.send_error(400, f"a body of at most {MAX_BODY} bytes expected")
        body = self.rfile.read(int(length))
        if not self._same_origin():
            return self._answer(403, {"refused": "same-origin requests only"})
        if path == SESSION_PATH:
            session = self.gate.redeem(self.headers.get(KEY_HEADER))
            if session is None:
                return self._answer(403, {"refused": "this link is not valid, expired or was already used"})
            return self._answer(200, {"session": session})
        return self._release(body)

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

    def _config(self):
        if not self.gate.admits(self.headers.get(SESSION_HEADER)):
            return self._answer(403, {"refused": "this tab has not opened the link `make serve` printed"})
        if not self._same_origin():
            return self._answer(403, {"refused": "same-origin requests only"})
        return self._answer(200, self.live)

    def _release(self, body):
        """Delete the kernel named in `body` (``{"kernel": id}``) for a page that is closing."""
        if not self.gate.admits(self.headers.get(SESSION_HEADER)):
            return self._answer(403, {"refused": "this tab has not opened the link `make serve` printed"})
        try:
            kernel = json.loads(body)["kernel"]
        except (ValueError, KeyError, TypeError):
            kernel = None
        if not isinstance(kernel, str) or not KERNEL_ID.fullmatch(kernel):
            return self._answer(400, {"refused": "a kernel id expected"})
        request = urllib.request.Request(f"{self.live['base_url']}api/kernels/{kernel}", method="DELETE",
                                         headers={"Authorization": f"token {self.live['token']}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        except (urllib.error.URLError, OSError):
            status = 502
        return self._answer(200 if status in (204, 404) else 502, {"kernel": kernel, "kernel_server": status})

    def cache_control(self):
        # The configuration holds the token, a session answer the session: never stored.
        return "no-store" if self.path.startswith("/_live/") else super().cache_control()


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
    (into / KERNEL_FOLDER).mkdir(parents=True, exist_ok=True)
    return into


def kernel_spec(into: Path) -> Path:
    """`into`, a Jupyter data folder whose ``kernels/python3`` spec runs ``_live_kernel.py``, which opens no TCP
    port (ipykernel's own launcher opens one for its subprocesses' output)."""
    spec = into / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(HERE / "_live_kernel.py"), "-f", "{connection_file}"],
        "display_name": "Python 3 (make serve)", "language": "python", "metadata": {"debugger": False},
    }))
    return into


class LiveServer:
    """The book at `site` on 127.0.0.1:`port` and a kernel server on 127.0.0.1:`kernel_port` (0: a free port).

    `announce(text)` is called with each notice for the terminal (a link used or expired, a new link).
    The limits (`link_seconds`, `session_idle`, `kernel_idle`, `max_kernels`, `read_timeout`) default to the
    module's constants; the tests shorten them."""

    def __init__(self, site, port=0, kernel_port=0, root=ROOT, handler=BookHandler, announce=None,
                 link_seconds=LINK_SECONDS, session_idle=SESSION_IDLE_SECONDS, kernel_idle=KERNEL_IDLE_SECONDS,
                 max_kernels=MAX_KERNELS, read_timeout=READ_TIMEOUT):
        self.site = Path(site)
        if not (self.site / "index.html").is_file():
            raise FileNotFoundError(f"no built book in {self.site} (run `make docs`)")
        self.token = secrets.token_urlsafe(32)
        handler = type("Handler", (handler,), {"live": {}, "timeout": read_timeout})
        self.httpd = http.server.ThreadingHTTPServer((HOST, port), functools.partial(handler, directory=str(self.site)))
        self.httpd.daemon_threads = True
        self.gate = handler.gate = Gate(self.httpd.server_address[1], announce, link_seconds, session_idle)
        self.url = f"{self.gate.origin}/"
        self.origin = self.gate.origin
        self.kernel_port = kernel_port or _free_port()
        self.kernel_url = f"http://{HOST}:{self.kernel_port}/"
        handler.live = {"base_url": self.kernel_url, "token": self.token}
        self.root = Path(root)
        self.limits = {"kernel_idle": kernel_idle, "max_kernels": max_kernels}
        self.run_dir = Path(tempfile.mkdtemp(prefix="ar-live-"))  # mode 0700: this user's only
        self.runtime_dir = self.run_dir / "runtime"  # connection files and the kernels' IPC sockets
        self.log = open(self.run_dir / "kernel-server.log", "w")  # closed by stop()
        self.process = None

    def new_link(self) -> str:
        """A fresh one-time link that lets one browser tab in (the one before it stops working)."""
        return self.gate.new_link()

    def start(self, timeout=60):
        env = {name: value for name, value in os.environ.items() if name not in SECRET_VARIABLES}
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["JUPYTER_NO_CONFIG"] = "1"  # no user or system configuration, so no server extensions
        self.runtime_dir.mkdir(mode=0o700)
        env["JUPYTER_RUNTIME_DIR"] = str(self.runtime_dir)  # connection files, sockets, cookie secret: this run's
        env["JUPYTER_PATH"] = str(kernel_spec(self.run_dir))  # its kernels/python3 comes first: _live_kernel.py
        scratch = scratch_root(self.root, self.run_dir / "scratch")
        self.process = subprocess.Popen(
            [
                sys.executable, "-c", "import _live_server; _live_server.serve_kernels()",
                f"--ServerApp.ip={HOST}",
                f"--ServerApp.port={self.kernel_port}",
                "--ServerApp.port_retries=0",
                "--ServerApp.open_browser=False",
                f"--ServerApp.allow_origin={self.origin}",
                # The same header on error answers too (tornado clears the others), so the page can read why
                # a request was refused, such as the kernel cap's message.
                f"--ServerApp.tornado_settings={json.dumps({'headers': {'Access-Control-Allow-Origin': self.origin}})}",
                f"--ServerApp.root_dir={scratch}",
                "--ServerApp.terminals_enabled=False",
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
            env=env, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # Ctrl-C reaches this process only; it stops the kernel server cleanly
        )
        self.process.stdin.write(self.token + "\n")
        self.process.stdin.close()
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the kernel server stopped (exit {self.process.returncode}): "
                                   f"{Path(self.log.name).read_text()[-2000:]}")
            try:
                request = urllib.request.Request(f"{self.kernel_url}api/status",
                                                 headers={"Authorization": f"token {self.token}"})
                with urllib.request.urlopen(request, timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    log = Path(self.log.name).read_text()[-2000:]
                    self.stop()
                    raise RuntimeError(f"the kernel server did not start in {timeout} s: {log}") from None
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
        self.log.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)  # the log, connection files, sockets, scratch folder

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
    parser.add_argument("--kernel-port", type=int, default=0)
    parser.add_argument("--link-seconds", type=float, default=LINK_SECONDS,
                        help=f"how long an unused link works (default {LINK_SECONDS})")
    args = parser.parse_args(argv)
    # Ctrl-C (and a plain kill) stop both servers, even where the shell started this with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    def announce(text):
        print(text, flush=True)

    server = LiveServer(args.site, args.port, args.kernel_port, announce=announce, link_seconds=args.link_seconds)
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

"""The book server's connections for ``make serve`` (part of ``_live_server.py``, which see): how many, how long.

* At most ``max_connections`` at a time. When one more arrives, the connection that has waited longest for a
  request (a keep-alive connection with no request being answered; one without a session first) is closed to
  make room: another local user who holds the cap's worth of idle connections locks nobody out. Failing that,
  a connection without a session whose answer has taken over ``SLOW_ANSWER`` seconds (a client that reads a
  file slowly on purpose) is closed. Only when every connection is being answered otherwise (a request in
  progress, a kernel's WebSocket) does the newcomer get 503.
* A connection waits for its next request at most ``read_timeout`` seconds, or ``idle_without_session`` seconds
  (shorter) until a request on it has shown a live session.
* A request must arrive whole within its deadline, however slowly it trickles in (`DeadlineReader`).
* What is wrong with a client (a malformed request line, a client gone) makes no traceback: at most one line in
  the terminal now and then (`BookServer.notice`).
* A kernel's WebSocket is spliced through (`splice`), and `ClientFrames` tells which of the reader's bytes were
  messages to the kernel, not control frames (the pongs a browser sends by itself): only messages count as the
  reader's use of the session.
"""

from __future__ import annotations

import http.server
import selectors
import socket
import sys
import threading
import time

from _live_gate import printable

MAX_CONNECTIONS = 64  # connections to the book server at a time (a tab opens up to 6, a kernel's WebSocket 1)
READ_TIMEOUT = 30  # s a connection may stay silent before the book server closes it
IDLE_WITHOUT_SESSION = 5  # s the same, for a connection on which no request has shown a live session
SLOW_ANSWER = 10  # s an answer without a session may take before its connection may be dropped for a newcomer
NOTICE_SECONDS = 10  # at most one line a while in the terminal about misbehaving clients
SECURITY_HEADERS = (("Content-Security-Policy", "frame-ancestors 'none'"), ("X-Frame-Options", "DENY"))
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n"
        b"Connection: close\r\nCache-Control: no-store\r\nRetry-After: 1\r\n"
        + b"".join(f"{name}: {value}\r\n".encode() for name, value in SECURITY_HEADERS) + b"\r\nserver busy.\n")
DATA_OPCODES = (0x0, 0x1, 0x2)  # RFC 6455: continuation, text, binary (0x8-0xA: close, ping, pong)


class Connection:
    """What the server knows of one connection: since when it waits for a request (None: one is being
    answered, since `answering_since`), and whether a request on it has shown a live session."""

    __slots__ = ("answering_since", "dropped", "session", "waiting_since")

    def __init__(self):
        self.waiting_since, self.answering_since, self.session, self.dropped = time.monotonic(), 0.0, False, False


class BookServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at a time (see the module's notes). `announce(text)`
    is where the terminal's lines go."""

    daemon_threads = True
    slow_answer = SLOW_ANSWER
    request_queue_size = 4 * MAX_CONNECTIONS  # listen()'s backlog (socketserver's is 5): many may connect at once

    def __init__(self, address, handler, max_connections=MAX_CONNECTIONS, announce=None):
        super().__init__(address, handler)
        self.max_connections = max_connections
        self.connections: dict[socket.socket, Connection] = {}
        self.count_lock = threading.Lock()
        self.announce = announce or (lambda text: print(text, file=sys.stderr, flush=True))
        self.noticed, self.unsaid = 0.0, 0

    @property
    def active(self):
        return len(self.connections)

    def _drop_one(self):
        """Close the connection that has waited longest for a request (one without a session first), else the
        one without a session whose answer has taken longest, over `slow_answer` seconds; whether there was
        one. Call with the lock held."""
        now = time.monotonic()
        found = [(False, state.session, state.waiting_since, id(sock), sock) if state.waiting_since is not None
                 else (True, False, state.answering_since, id(sock), sock)
                 for sock, state in self.connections.items()
                 if state.waiting_since is not None
                 or (not state.session and now - state.answering_since > self.slow_answer)]
        if not found:
            return False
        sock = min(found)[4]
        self.connections.pop(sock).dropped = True
        try:
            sock.shutdown(socket.SHUT_RDWR)  # its thread reads the end and finishes
        except OSError:
            pass
        return True

    def process_request(self, request, client_address):
        with self.count_lock:
            full = len(self.connections) >= self.max_connections and not self._drop_one()
            if not full:
                self.connections[request] = Connection()
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
            self.forget(request)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.forget(request)

    def forget(self, request):
        with self.count_lock:
            self.connections.pop(request, None)

    def state(self, request) -> Connection:
        return self.connections.get(request) or Connection()

    def waiting(self, request):
        """`request`'s connection now waits for its next request."""
        with self.count_lock:
            if request in self.connections:
                self.connections[request].waiting_since = time.monotonic()

    def answering(self, request) -> bool:
        """`request`'s connection has a whole request to answer (it will not be dropped for another); False if
        it was dropped already."""
        with self.count_lock:
            state = self.connections.get(request)
            if state is not None:
                state.waiting_since, state.answering_since = None, time.monotonic()
            return state is not None

    def with_session(self, request):
        """A request on `request`'s connection showed a live session: it may wait the longer `read_timeout`."""
        with self.count_lock:
            if request in self.connections:
                self.connections[request].session = True

    def notice(self, text):
        """One line for the terminal about a misbehaving client, at most one every `NOTICE_SECONDS` (with a
        count of those not shown): a local process cannot flood the terminal."""
        with self.count_lock:
            now = time.monotonic()
            if now - self.noticed < NOTICE_SECONDS:
                self.unsaid += 1
                return
            unsaid, self.noticed, self.unsaid = self.unsaid, now, 0
        self.announce(f"make serve: {text}" + (f" ({unsaid} more like it not shown)" if unsaid else ""))

    def handle_error(self, request, client_address):
        """One quiet line, never a traceback, whatever went wrong with a client's connection."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            frame = error.__traceback__
            while frame.tb_next:
                frame = frame.tb_next
            where = f"{frame.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.tb_lineno}"
            self.notice(f"a request failed: {type(error).__name__}: {printable(str(error))} ({where})")


class DeadlineReader(socket.SocketIO):
    """A connection's reading end that gives up when `handler.deadline` (monotonic seconds, None: no deadline)
    has passed, however the bytes trickle in, and waits for bytes at most `handler.idle_timeout()` seconds."""

    def __init__(self, sock, handler):
        super().__init__(sock, "rb")
        self.handler = handler

    def readinto(self, buffer):
        deadline = self.handler.deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive within its deadline")
            self._sock.settimeout(min(left, self.handler.idle_timeout()))
        return super().readinto(buffer)


class ClientFrames:
    """Follows the WebSocket frames a client sends (RFC 6455, section 5.2), chunk by chunk as they pass:
    `feed(chunk)` tells whether a message frame (text, binary, continuation) began in it, as opposed to
    control frames only (ping, pong, close)."""

    def __init__(self):
        self.head = b""  # the start of a frame header cut by a chunk's end
        self.skip = 0  # bytes of the current frame's payload still to pass

    def feed(self, chunk: bytes) -> bool:
        data, at, message = self.head + chunk, 0, False
        while True:
            passed = min(self.skip, len(data) - at)
            self.skip -= passed
            at += passed
            if self.skip or len(data) - at < 2:
                break
            first, second = data[at], data[at + 1]
            length = second & 0x7F
            extended = {126: 2, 127: 8}.get(length, 0)
            header = 2 + extended + (4 if second & 0x80 else 0)
            if len(data) - at < header:
                break
            if extended:
                length = int.from_bytes(data[at + 2:at + 2 + extended], "big")
            message = message or (first & 0x0F) in DATA_OPCODES
            at += header
            self.skip = length
        self.head = data[at:]
        return message


def splice(client, upstream, on_client_data):
    """Pass bytes both ways between two sockets until either side closes or `on_client_data(chunk)`, called
    with each of the client's chunks before it is passed on, returns False."""
    client.settimeout(None)
    with selectors.DefaultSelector() as selector:
        selector.register(client, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, client)
        while True:
            for found, _ in selector.select():
                try:
                    data = found.fileobj.recv(65536)
                    if not data or (found.fileobj is client and not on_client_data(data)):
                        return
                    found.data.sendall(data)
                except OSError:
                    return

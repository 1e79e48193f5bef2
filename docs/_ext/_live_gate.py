"""Who may use ``make serve``'s kernels: one-time keys, the sessions they buy, and the file that carries a key.

Part of ``_live_server.py`` (which see): a key is put in a link, ``http://127.0.0.1:PORT/#live-key=K``, that is
never printed and never passed to a program as an argument, where every local user could read it
(``/proc/PID/cmdline`` of a browser opened on it). It is written, as jupyter_server writes its
``jpserver-*-open.html``, into a small redirect page only the reader can read (`write_redirect`: mode 0600, in
the run's private folder, mode 0700); the terminal shows that page's ``file://`` address, and a browser opened on
it follows the redirect. The page is deleted when its key is used or expires.

A key works once: its use is announced in the terminal with the time and the browser's ``User-Agent``, so a key
taken by someone else is seen; a tab that brings an already used key is told so (`Gate.refusal`). A session ends
when it has been idle for ``session_idle`` seconds (only the reader's requests and messages to a kernel count,
never WebSocket control frames) or, whatever its use, ``session_lifetime`` seconds after it began; a page whose
session ended is told which (`Gate.ended`).
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import secrets
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
LINK_FRAGMENT = "live-key"
LINK_SECONDS = 300  # an unused link expires after 5 minutes
SESSION_IDLE_SECONDS = 2 * 3600  # a session the reader leaves unused for 2 hours ends
SESSION_LIFETIME_SECONDS = 12 * 3600  # and any session ends 12 hours after it began
REMEMBERED = 64  # spent keys and ended sessions remembered (as digests), to tell a page why it is refused
USER_AGENT_CHARACTERS = 200  # of a User-Agent shown in the terminal


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def printable(text: str | None, limit: int = USER_AGENT_CHARACTERS) -> str:
    """`text` (a header another process chose) safe for a terminal: printable ASCII only, at most `limit`
    characters; ``(none)`` if empty."""
    text = re.sub(r"[^\x20-\x7e]", "?", text or "")
    return (text[:limit] + "...") if len(text) > limit else (text or "(none)")


def write_redirect(path: Path, link: str):
    """A page at `path` (mode 0600, replaced whole) that sends the browser opening it to `link`."""
    quoted = html.escape(link, quote=True)
    text = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"refresh\" content=\"0;url={quoted}\"><title>Opening the book</title></head>\n"
            f"<body><p>Opening <a href=\"{quoted}\">the book, with live code</a>...</p></body></html>\n")
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(partial, path)


class _Remembered(dict):
    """At most `REMEMBERED` entries: the oldest goes first."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        while len(self) > REMEMBERED:
            del self[next(iter(self))]


class Gate:
    """Who may use the kernels: a page of this server's origin holding a session, which it got for a one-time
    key (in a link's fragment, so sent nowhere but by that page's script); each session reaches the kernels it
    started.

    `announce(text)` is called with each line for the terminal: a link used (when, by which browser), a link
    expired, a session ended. `on_expire(kernels, connections)` is called (outside the lock) with what an ended
    session held. `link_file`, if given, is where each new link is written (`write_redirect`), and deleted when
    its key is used or expires. `clock` is a monotonic clock in seconds (the tests pass their own)."""

    def __init__(self, port, announce=None, link_seconds=LINK_SECONDS, session_idle=SESSION_IDLE_SECONDS,
                 clock=time.monotonic, on_expire=None, session_lifetime=SESSION_LIFETIME_SECONDS, link_file=None):
        self.port = port
        self.origin = f"http://{HOST}:{port}"
        self.hosts = {f"{HOST}:{port}": "here", f"localhost:{port}": "redirect"}
        self.announce = announce or (lambda text: None)
        self.on_expire = on_expire or (lambda kernels, connections: None)
        self.link_seconds, self.session_idle, self.clock = link_seconds, session_idle, clock
        self.session_lifetime = session_lifetime
        self.link_file = Path(link_file) if link_file else None
        self.sessions: dict[str, float] = {}  # session -> when the reader last used it
        self.born: dict[str, float] = {}  # session -> when it began
        self.kernels: dict[str, str] = {}  # kernel id -> the session that started it
        self.connections: dict[str, set] = {}  # session -> its open WebSocket connections (sockets)
        self.spent: dict[str, str] = _Remembered()  # digest of a key -> "used" or "expired"
        self.gone: dict[str, str] = _Remembered()  # digest of an ended session -> "idle" or "lifetime"
        self.lock = threading.Lock()
        self.key: str | None = None
        self.key_expires = 0.0

    def new_link(self) -> str:
        """A fresh one-time link (the previous one stops working), written to `link_file` if there is one; it
        expires unused after `link_seconds`."""
        with self.lock:
            if self.key:
                self.spent[_digest(self.key)] = "expired"
            self.key = key = secrets.token_urlsafe(32)
            self.key_expires = self.clock() + self.link_seconds
            link = f"{self.origin}/#{LINK_FRAGMENT}={key}"
            if self.link_file:
                write_redirect(self.link_file, link)
        timer = threading.Timer(self.link_seconds, self._expired, (key,))
        timer.daemon = True
        timer.start()
        return link

    def _forget_key(self, why):
        """The current key spent (`why`: "used" or "expired") and its file deleted; call with the lock held."""
        self.spent[_digest(self.key)] = why
        self.key = None
        if self.link_file:
            self.link_file.unlink(missing_ok=True)

    def _expired(self, key):
        with self.lock:
            if self.key != key:
                return  # used, or replaced by a newer link
            self._forget_key("expired")
        self.announce(f"The live-code link expired unused ({self.link_seconds:g} s). Press Enter for a new one.")

    def redeem(self, key: str | None, user_agent: str | None = None) -> str | None:
        """A new session for the current, unexpired `key` (which is then spent, and the terminal told when and
        by which browser, `user_agent`), else None."""
        with self.lock:
            if not (key and self.key and self.clock() < self.key_expires
                    and secrets.compare_digest(key.encode(), self.key.encode())):
                return None  # an expired key is forgotten by its timer, which tells the terminal
            self._forget_key("used")
            session = secrets.token_urlsafe(32)
            self.sessions[session] = self.born[session] = self.clock()
        self.announce(f"The live-code link was used at {time.strftime('%H:%M:%S')} by a browser that says it is "
                      f"\"{printable(user_agent)}\"; it works no more. If that was not you, stop `make serve` "
                      "now (Ctrl-C). For another browser or tab, press Enter here for a new link.")
        return session

    def refusal(self, key: str | None) -> str:
        """Why `key` lets nobody in: "used" (it was, by someone), "expired", or "unknown"."""
        with self.lock:
            if key and self.key and secrets.compare_digest(key.encode(), self.key.encode()):
                return "expired"  # the current key, refused: its time is up (its timer has not yet run)
            return self.spent.get(_digest(key), "unknown") if key else "unknown"

    def ended(self, session: str | None) -> str | None:
        """Why `session` ended ("idle" or "lifetime"), or None if it is live or was never one."""
        with self.lock:
            return self.gone.get(_digest(session)) if session else None

    def sweep(self):
        """Forget the sessions idle for over `session_idle` seconds or begun over `session_lifetime` seconds ago,
        and hand what they held to `on_expire`."""
        with self.lock:
            now = self.clock()
            gone = {known: "idle" if now - used > self.session_idle else "lifetime"
                    for known, used in self.sessions.items()
                    if now - used > self.session_idle or now - self.born[known] > self.session_lifetime}
            for session, why in gone.items():
                del self.sessions[session], self.born[session]
                self.gone[_digest(session)] = why
            kernels = [kernel for kernel, owner in self.kernels.items() if owner in gone]
            for kernel in kernels:
                del self.kernels[kernel]
            connections = [c for session in gone for c in self.connections.pop(session, ())]
        if kernels or connections:
            self.on_expire(kernels, connections)
        for why in gone.values():
            limit = (f"unused for {self.session_idle:g} s" if why == "idle"
                     else f"{self.session_lifetime:g} s old, its longest life")
            self.announce(f"A live-code session expired ({limit}); its kernels are shut down. Press Enter for a new "
                          "link.")

    def _known(self, session):
        """`session` if it is live (call with the lock held), else None."""
        return next((known for known in self.sessions
                     if session and secrets.compare_digest(session.encode(), known.encode())), None)

    def admits(self, session: str | None, kernel: str | None = None, touch: bool = True) -> bool:
        """Whether `session` is live, and started `kernel` if one is named; if so and `touch`, the reader used it
        now (its idle time starts again). Ended sessions are forgotten first."""
        self.sweep()
        with self.lock:
            known = self._known(session)
            if known is None or (kernel is not None and self.kernels.get(kernel) != known):
                return False
            if touch:
                self.sessions[known] = self.clock()
            return True

    def adopt(self, session: str, kernel: str) -> bool:
        """Record that `session` started `kernel`; False if the session ended meanwhile."""
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

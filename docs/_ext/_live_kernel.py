"""The Python kernel ``make serve`` starts (``_live_server.py`` writes a kernel spec that runs this file): ipykernel
as usual, except that it opens no TCP port.

With ``KernelManager.transport=ipc`` a kernel's five channels are Unix sockets in the run's private folder, but
ipykernel's IOPub thread still binds one more socket of its own, a ZMQ PULL socket on a random TCP port of
127.0.0.1 (``IOPubThread(..., pipe=True)`` in ``IPKernelApp.init_iopub``), through which subprocesses forked by the
kernel forward their output. Here that pipe is off (``pipe=False``), so the kernel listens on no TCP port at all;
what a forked subprocess prints is not shown (the book's chapters fork none). Relies on
``ipykernel.iostream.IOPubThread.__init__(self, socket, pipe, ...)``, checked at start. Verified with ipykernel
7.4.0.
"""

from __future__ import annotations

import inspect


def without_pipe(thread_class):
    """Make `thread_class` (ipykernel's ``IOPubThread``) ignore its ``pipe`` argument: always no pipe."""
    original = thread_class.__init__
    if tuple(inspect.signature(original).parameters)[:3] != ("self", "socket", "pipe"):
        raise RuntimeError(f"ipykernel's IOPubThread.__init__ changed: {inspect.signature(original)}; "
                           "_live_kernel.py needs updating")

    def __init__(self, socket, pipe=False, *args, **kwargs):
        original(self, socket, False, *args, **kwargs)

    thread_class.__init__ = __init__


def main():
    from ipykernel import iostream, kernelapp

    without_pipe(iostream.IOPubThread)
    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()

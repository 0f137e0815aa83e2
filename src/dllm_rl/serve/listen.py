"""Listening: the server's socket, bound before the model loads and handed to uvicorn, and uvicorn's server whose
shutdown ends the grace period itself.

The socket is bound and listening before the model loads, so a port in use is a one-line error at once, and uvicorn
binds nothing itself: no other process can take the port between the check and the serving.

On SIGTERM uvicorn stops accepting connections and waits for the requests held; at its own timeout it cancels
their tasks, which logs a traceback each and answers nothing. :class:`GracefulServer` fails the requests still held
at ``--shutdown-timeout-s`` through the worker instead (a JSON 503 each, a stream's error event, one log line each),
and gives uvicorn :data:`FLUSH_S` more for those answers to leave before its cancellation, the last resort.
"""

from __future__ import annotations

import asyncio
import errno
import socket

import uvicorn

from dllm_rl.errors import UserError

FLUSH_S = 5.0  # after --shutdown-timeout-s: time for the failed requests' answers to leave before uvicorn cancels
BACKLOG = 2048  # connections the kernel queues until they are accepted (uvicorn's default)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (port 0: a free one, its number ``getsockname()[1]``), or a one-line
    :class:`UserError`. Connections made before the server starts wait in the kernel's queue."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise UserError(f"--host {host}: not an address of this machine ({err.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart may reuse the port at once
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise UserError(f"--port {port}: {host}:{port} is already in use; stop what listens there or choose "
                            "another port (--port 0: any free one)") from None
        raise UserError(f"--host {host} --port {port}: cannot listen there ({err.strerror})") from None
    return sock


class GracefulServer(uvicorn.Server):
    """uvicorn's server over ``server`` (a :class:`~dllm_rl.serve.app.Server`): at shutdown its requests have
    ``grace_s`` seconds (default ``server.limits.shutdown_timeout_s``), then those still held fail with a 503
    (see the module docstring)."""

    def __init__(self, server, log_level: str = "warning", grace_s: float | None = None):
        from dllm_rl.serve.app import create_app

        self.app_server = server
        self.grace_s = server.limits.shutdown_timeout_s if grace_s is None else grace_s
        super().__init__(uvicorn.Config(create_app(server), log_level=log_level,
                                        timeout_graceful_shutdown=self.grace_s + FLUSH_S))
        self._failing: asyncio.Future | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.app_server.closing = True  # /health says so; a request arriving now is answered 503
        timer = asyncio.get_running_loop().call_later(self.grace_s, self._end_grace)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
            if self._failing is not None:
                await self._failing

    def _end_grace(self) -> None:
        reason = (f"the server shut down before the request finished (its --shutdown-timeout-s, {self.grace_s:g} s, "
                  "ran out)")
        # stopping the worker waits for its step to end: off the event loop, which must go on sending answers
        self._failing = asyncio.ensure_future(asyncio.to_thread(self.app_server.worker.stop, reason))

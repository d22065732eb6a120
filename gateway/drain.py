"""A graceful gateway stop: drain, then let uvicorn close what is left.

On SIGTERM (or SIGINT) a gateway:

1. fails ``/readyz`` (503 ``draining``) at once, so a load balancer or Kubernetes stops
   sending it new clients, and keeps serving for ``SIGNOFF_DRAIN_SECONDS`` (default 2) while
   they notice;
2. stops accepting connections (its listening socket is closed);
3. closes every WebSocket with code **1012** ("service restart"), which the chat page and
   ``docs/websocket.md`` define as *reconnect now, elsewhere*: the client reconnects to the
   same URL at once (the proxy in front sends it to another gateway) and sends
   ``resume{after_seq}`` with the last seq it applied, so it loses and repeats nothing;
4. finishes the HTTP requests in flight (idle keep-alive connections are closed), then
   exits. A second signal stops at once.

Steps 2-4 are uvicorn's own shutdown (``Server.shutdown``: it sends 1012 on open
WebSockets); what this module adds is step 1 and its delay.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from types import FrameType
from typing import Any

import uvicorn

from signoff.runtime.errors import ConfigError

log = logging.getLogger("signoff.gateway")

CLOSE_RECONNECT = 1012  # the close code a stopping gateway sends (uvicorn's, standard)


class ListenFailed(ConfigError):
    """The gateway could not start listening (most often: its port is in use)."""

    code = "listen_failed"


def listen_failed(host: str, port: int, cause: BaseException | None) -> ListenFailed:
    """What to tell the operator when uvicorn gave up starting (``cause``: the error it
    was handling, the ``OSError`` of its bind when that is what failed)."""
    if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
        return ListenFailed(
            f"port {port} on {host} is in use (another process listens there): stop it, "
            "or choose another port with --port or SIGNOFF_PORT"
        )
    if isinstance(cause, OSError):
        return ListenFailed(f"cannot listen on {host}:{port}: {cause}")
    return ListenFailed(f"the gateway's server failed to start on {host}:{port}")


def check_port(host: str, port: int) -> None:
    """Refuse a port another process listens on before anything is started for it
    (``signoff dev`` made a whole embedded Postgres, then failed on the port)."""
    if port == 0:
        return
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise listen_failed(host, port, exc) from None


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains (``state.draining``, the flag
    ``/readyz`` reads) for ``drain_seconds`` before the usual shutdown."""

    def __init__(self, config: uvicorn.Config, state: Any, drain_seconds: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_seconds = drain_seconds
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await super().serve(sockets)
        except SystemExit as exc:
            # uvicorn ends a failed start (a port in use, say) with sys.exit(3) in this
            # task: asyncio lets a SystemExit escape the event loop, the process dies with
            # a "Task exception was never retrieved" traceback and nothing awaits the
            # task. An ordinary error goes to whoever awaits it, which stops the node.
            cause = exc.__context__  # the error uvicorn was handling (and has logged)
            raise listen_failed(self.config.host, self.config.port, cause) from cause

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # The signal is not re-raised after the shutdown (uvicorn's default): the process
        # goes on to close its node (presence row, bus, pool) and exits 0.
        if getattr(self.state, "draining", False) or self._loop is None:
            self.should_exit = True  # a second signal: stop now
            self.force_exit = True
            return
        self.drain()

    def drain(self) -> None:
        """Fail /readyz now, stop after the drain delay (callable from a signal handler)."""
        self.state.draining = True
        if self.drain_seconds > 0:  # the normal way out (a deploy, a scale-down): info
            log.info(
                "stopping: /readyz fails now; no new connections in %.1fs, then WebSockets "
                "closed with %d (reconnect elsewhere) and requests in flight finished",
                self.drain_seconds,
                CLOSE_RECONNECT,
            )
        else:
            log.info(
                "stopping: WebSockets closed with %d, requests in flight finished", CLOSE_RECONNECT
            )
        assert self._loop is not None
        self._loop.call_soon_threadsafe(
            self._loop.call_later, max(self.drain_seconds, 0.0), self._exit
        )

    def stop_now(self) -> None:
        """Fail /readyz and stop without the drain delay (requests in flight still get
        uvicorn's graceful shutdown): this process must not take more work."""
        self.state.draining = True
        self.should_exit = True

    def _exit(self) -> None:
        self.should_exit = True

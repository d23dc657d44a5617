"""A synchronous MCP client for tests and benchmarks, over the official `mcp` 2.x SDK,
speaking stdio (it spawns the server) or Streamable HTTP (to a running server).

The SDK is asyncio-only and its transport and session are context managers that
must be entered and exited in the same task. So one background thread runs an
event loop, and one task in it (`_own`) holds both contexts open until `close()`.
Each call is submitted to that loop as its own task and awaited from the calling
thread with a timeout, so a stuck server fails the test instead of hanging it.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from typing import Any, Awaitable, Callable

import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

# Starting includes spawning the server; a cold debug build can be slow.
START_TIMEOUT = 60.0
# Default per-call limit; tests pass a larger one for long tool calls.
CALL_TIMEOUT = 60.0
# The SDK's default per-event limit (1 MiB) is below the largest tool result
# (`logs` returns up to 1 MiB of text, JSON-escaped in one SSE event).
MAX_SSE_EVENT = 16 << 20
# stdio_client gives the server 2 s after stdin closes, then kills its tree.
CLOSE_TIMEOUT = 15.0


class McpError(AssertionError):
    """The client could not talk to the server (start, call or close failed).

    An AssertionError so pytest reports it as a test failure with the message.
    """


def result_text(result: Any) -> str:
    """The concatenated text parts of a tool result."""
    return "".join(getattr(c, "text", "") for c in result.content)


class McpClient:
    """One MCP session, driven synchronously: over stdio with a server process
    of its own, or over Streamable HTTP to a server someone else runs."""

    def __init__(
        self,
        command: str | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        stderr_path: str | None = None,
        cwd: str | None = None,
        start_timeout: float = START_TIMEOUT,
        url: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        """Stdio: spawns `command args` with exactly `env` (plus the SDK's
        PATH/HOME defaults); the server's stderr goes to `stderr_path` (or
        ours). HTTP (`url`): connects with `headers` on every request;
        `stderr_path` then names the server's log, for failure messages.
        Either way, initializes the session and returns once it is ready."""
        if (command is None) == (url is None):
            raise ValueError("give exactly one of command (stdio) and url (HTTP)")
        self.stderr_path = stderr_path
        self.url = url
        self._headers = dict(headers or {})
        # The Mcp-Session-Id the HTTP server assigned (None over stdio).
        self.session_id: str | None = None
        self._errlog = open(stderr_path, "a", buffering=1) if stderr_path and url is None else None
        self._params = (
            StdioServerParameters(command=command, args=list(args or []), env=env, cwd=cwd) if command else None
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        self._session: ClientSession | None = None
        self.server_info: Any = None
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._closing: asyncio.Event | None = None
        self._owner = asyncio.run_coroutine_threadsafe(self._own(), self._loop)
        try:
            self._ready.result(timeout=start_timeout)
        except BaseException as e:
            self._shutdown_loop()
            raise McpError(f"MCP server {command or url} did not start: {e!r}{self._stderr_tail()}") from e

    async def _own(self) -> None:
        self._closing = asyncio.Event()
        try:
            if self.url is None:
                errlog = self._errlog or sys.stderr
                async with stdio_client(self._params, errlog=errlog) as (read, write):
                    await self._hold(read, write)
            else:
                async with create_mcp_http_client(headers=self._headers) as http:
                    http.event_hooks["response"].append(self._note_session)
                    stream = streamable_http_client(self.url, http_client=http, max_sse_event_size=MAX_SSE_EVENT)
                    async with stream as (read, write):
                        await self._hold(read, write)
        except BaseException as e:
            if not self._ready.done():
                self._ready.set_exception(e)
            raise
        finally:
            self._session = None

    async def _hold(self, read: Any, write: Any) -> None:
        """Runs the session on one transport until `close()`."""
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            self._session = session
            self.server_info = init
            self._ready.set_result(True)
            await self._closing.wait()

    async def _note_session(self, response: httpx2.Response) -> None:
        sid = response.headers.get("mcp-session-id")
        if sid and self.session_id is None:
            self.session_id = sid

    def _run(self, make: Callable[[ClientSession], Awaitable[Any]], timeout: float, what: str) -> Any:
        session = self._session
        if session is None:
            raise McpError(f"{what}: the MCP session is closed{self._stderr_tail()}")
        fut = asyncio.run_coroutine_threadsafe(make(session), self._loop)
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise McpError(f"{what}: no answer within {timeout} s{self._stderr_tail()}") from None
        except Exception as e:
            raise McpError(f"{what}: {e!r}{self._stderr_tail()}") from e

    def call_raw(self, tool: str, /, *, call_timeout: float | None = None, **args: Any) -> Any:
        """Calls a tool and returns the SDK's CallToolResult (`is_error`,
        `content`, `structured_content`). Keyword arguments are the tool's
        arguments (`timeout` included: that one is the tool's own); the client
        waits `call_timeout`, by default long enough to outlast the tool's."""
        if call_timeout is None:
            call_timeout = CALL_TIMEOUT
            if isinstance(args.get("timeout"), (int, float)):
                call_timeout = max(call_timeout, float(args["timeout"]) + CALL_TIMEOUT)
        return self._run(lambda s: s.call_tool(tool, args), call_timeout, f"call {tool}")

    def call(self, tool: str, /, *, call_timeout: float | None = None, **args: Any) -> tuple[str, bool]:
        """Calls a tool and returns (text of the result, is_error)."""
        result = self.call_raw(tool, call_timeout=call_timeout, **args)
        return result_text(result), bool(result.is_error)

    tool = call

    def tool(self, tool: str, _timeout: float = CALL_TIMEOUT, **args: Any) -> tuple[str, bool]:
        """Like `call`, for tools that take a `timeout` argument of their own:
        the client-side limit is `_timeout` here."""
        result = self._run(lambda s: s.call_tool(tool, args), _timeout, f"call {tool}")
        return result_text(result), bool(result.is_error)

    def list_tools(self, timeout: float = CALL_TIMEOUT) -> list[Any]:
        """Every tool the server offers (the SDK's Tool objects)."""
        return self._run(lambda s: s.list_tools(), timeout, "list_tools").tools

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Closes the session (over stdio: and the server's stdin, and the
        SDK stops the server, killing it after a grace period), and stops the
        loop. Safe to call twice."""
        if not self._loop.is_closed() and self._closing is not None:
            self._loop.call_soon_threadsafe(self._closing.set)
            try:
                self._owner.result(timeout=timeout)
            except BaseException:
                self._owner.cancel()
        self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()
        if self._errlog:
            self._errlog.close()

    def _stderr_tail(self, lines: int = 30) -> str:
        if not self.stderr_path:
            return ""
        try:
            with open(self.stderr_path, errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError:
            return ""
        return "\n--- server stderr (tail) ---\n" + "".join(tail) if tail else ""

    def __enter__(self) -> "McpClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

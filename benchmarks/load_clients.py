"""The two load generators of ``bench_server.py``: a Python asyncio + httpx client, and ``wrk``.

Both send one-item Open Inference Protocol (v2 JSON) requests back to back from ``concurrency``
connections, and report what one measured window saw: requests, errors, p50 / p99 latency and
the server process's CPU time over that window (``/proc/<pid>/stat``, user + system), sampled
when the warm-up ends and when the window closes.

- :func:`drive_python`: what a Python user's client does (one process, many coroutines); every
  answer is checked against the expected one. With ``lean=True`` its coroutines speak HTTP/1.1
  over asyncio's streams themselves (:class:`LeanConnection`) instead of through httpx, still
  reading every answer, at a fraction of the CPU a request: on 2 shared cores, httpx's transport
  (about 1.1 ms a request on an AVX2 host) takes a whole core and sets the rate itself.
- :func:`drive_wrk`: Debian's ``wrk`` (C, epoll) with a Lua script that cycles through the
  request bodies, the load generator that costs the client least. It counts errors (socket
  errors and non-2xx answers) but does not read the answers.

Each has a paired form that drives several servers at once, ``concurrency`` connections each,
over the same window, so that the machine's drift (on a shared 2-core VM, the same server read
198-399 req/s in windows a few seconds apart) falls on all of them alike; the servers share
their core, alike: :func:`drive_python_paired` (one event loop, every server's coroutines) and
:func:`drive_wrk_paired` (one ``wrk``, one thread per server through ``thread.addr``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

JSON_HEADERS = {"content-type": "application/json"}


@dataclass
class Window:
    """What one measured window saw."""

    requests: int
    errors: int
    mismatches: int
    seconds: float
    p50_ms: float
    p99_ms: float
    server_cpu_s: float


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LeanConnection:
    """One keep-alive HTTP/1.1 connection to an ``http://`` URL that posts JSON bodies and
    reads whole answers (``Content-Length`` bodies, as the server sends them). Any failure, and
    an answer slower than ``timeout`` seconds, closes it (the next post reconnects) and raises
    ``ConnectionError``."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"url must be an http:// URL with a host, got {url!r}")
        self.host, self.port, self.timeout = parts.hostname, parts.port or 80, timeout
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.head = b"POST %s HTTP/1.1\r\nHost: %s\r\ncontent-type: application/json\r\n" % (
            target.encode(),
            parts.netloc.encode(),
        )
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        """Post ``body``; the answer's status and body."""
        try:
            async with asyncio.timeout(self.timeout):
                status, content, close = await self._exchange(body)
        except (OSError, EOFError, ValueError, asyncio.LimitOverrunError) as error:
            await self.aclose()  # (TimeoutError is an OSError)
            raise ConnectionError(f"{type(error).__name__}: {error}") from None
        except BaseException:  # cancelled half-way: the connection is out of step
            await self.aclose()
            raise
        if close:
            await self.aclose()
        return status, content

    async def _exchange(self, body: bytes) -> tuple[int, bytes, bool]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(b"%scontent-length: %d\r\n\r\n%s" % (self.head, len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        version, _, rest = head.split(b"\r\n", 1)[0].partition(b" ")
        code = rest[:3]
        if (
            version not in (b"HTTP/1.1", b"HTTP/1.0")
            or not code.isdigit()
            or rest[3:4] not in (b" ", b"")
        ):
            raise ValueError(f"not an HTTP/1.x status line: {head[:40]!r}")
        status, length, close = int(code), None, version == b"HTTP/1.0"
        for line in head.lower().split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                raise ValueError("a chunked answer")
            elif name == b"connection":
                close = b"close" in value
        if length is None and not (status < 200 or status in (204, 304)):
            raise ValueError(f"an answer ({status}) without Content-Length")
        content = await self.reader.readexactly(length or 0)
        return status, content, close

    async def aclose(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


def request_body(source: str) -> bytes:
    tensor = {"name": "source", "shape": [1], "datatype": "BYTES", "data": [source]}
    return json.dumps({"inputs": [tensor]}).encode()


async def drive_python(
    infer_url: str,
    sources: list[str],
    expected: dict[str, str],
    concurrency: int,
    duration: float,
    warmup: float,
    pid: int | None = None,
    stock: bool = False,
    measure_from: float | None = None,
    lean: bool = False,
) -> Window:
    """``concurrency`` coroutines in this process, each with its own connection; every answer
    checked against ``expected``. ``pid``: the server process whose CPU time to measure (None:
    not measured, ``server_cpu_s`` is NaN). ``stock``: post through one shared
    ``httpx.AsyncClient`` with httpx's default limits (what a user's script does, and costlier
    per request) instead of one transport per coroutine; ``lean``: a :class:`LeanConnection`
    per coroutine instead (the least CPU a request). ``measure_from``: when the measured
    window starts (``time.monotonic()``; default: ``warmup`` seconds from now)."""
    if stock and lean:
        raise ValueError("stock and lean are two different clients: pick one")
    latencies: list[float] = []
    errors = mismatches = 0
    if measure_from is None:
        measure_from = time.monotonic() + warmup
    stop_at = measure_from + duration
    cpu = {}

    def server_cpu_seconds() -> float:
        return float("nan") if pid is None else cpu_seconds(pid)

    async def sample_cpu() -> None:
        await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
        cpu["start"] = server_cpu_seconds()

    Transport = httpx.AsyncHTTPTransport | LeanConnection | None

    async def post(transport: Transport, body: bytes) -> tuple[int, bytes]:
        if isinstance(transport, LeanConnection):
            return await transport.post(body)
        if transport is None:  # stock
            response = await shared.post(infer_url, content=body, headers=JSON_HEADERS)
            return response.status_code, response.content
        request = httpx.Request("POST", infer_url, content=body, headers=JSON_HEADERS)
        response = await transport.handle_async_request(request)
        return response.status_code, await response.aread()

    async def client(index: int, transport: Transport) -> None:
        nonlocal errors, mismatches
        i = index
        while (now := time.monotonic()) < stop_at:
            source = sources[i % len(sources)]
            i += concurrency
            try:
                status, content = await post(transport, request_body(source))
                ok = status == 200
                answer = json.loads(content)["outputs"][0]["data"][0] if ok else None
            except (httpx.HTTPError, ConnectionError):
                ok, answer = False, None
            except (ValueError, KeyError, IndexError, TypeError):  # a 200 that is no v2 answer
                ok, answer = False, None
            done = time.monotonic()
            if now < measure_from:
                continue
            if not ok:
                errors += 1
            elif answer != expected[source]:
                mismatches += 1
            latencies.append(done - now)

    # One connection per simulated user, through httpx's transport layer: httpx.AsyncClient's
    # per-request work (URL merging, cookies, auth, hooks) cost 1.07 ms of CPU per request
    # against 0.68 ms for the transport alone. (One AsyncClient shared by 64 tasks costs
    # several ms per request in its pool.)
    ssl_context = ssl.create_default_context()  # made once: one per transport costs ~10 ms each
    if stock:  # httpx's defaults (100 connections, 20 kept alive, 5 s timeouts)
        shared, transports = httpx.AsyncClient(verify=ssl_context), [None] * concurrency
    elif lean:
        shared, transports = None, [LeanConnection(infer_url) for _ in range(concurrency)]
    else:
        shared = None
        transports = [httpx.AsyncHTTPTransport(verify=ssl_context) for _ in range(concurrency)]
    try:
        sampler = asyncio.create_task(sample_cpu())
        await asyncio.gather(*(client(i, t) for i, t in enumerate(transports)))
        await sampler
        server_cpu = server_cpu_seconds() - cpu["start"]
    finally:
        for transport in transports:
            if transport is not None:
                await transport.aclose()
        if shared is not None:
            await shared.aclose()
    lat_ms = np.array(latencies) * 1000
    return Window(
        requests=len(latencies),
        errors=errors,
        mismatches=mismatches,
        seconds=time.monotonic() - measure_from,
        p50_ms=float(np.percentile(lat_ms, 50)) if len(lat_ms) else float("nan"),
        p99_ms=float(np.percentile(lat_ms, 99)) if len(lat_ms) else float("nan"),
        server_cpu_s=server_cpu,
    )


async def drive_python_paired(
    infer_urls: list[str],
    sources: list[str],
    expected: dict[str, str],
    concurrency: int,
    duration: float,
    warmup: float,
    pids: list[int],
) -> list[Window]:
    """:func:`drive_python` against several servers at once, in one event loop (``concurrency``
    coroutines per server): one :class:`Window` per server, over the same wall-clock window."""
    start = time.monotonic() + warmup
    windows = await asyncio.gather(
        *(
            drive_python(
                url, sources, expected, concurrency, duration, warmup, pid, measure_from=start
            )  # fmt: skip
            for url, pid in zip(infer_urls, pids, strict=True)
        )
    )
    return list(windows)


# -- wrk ---------------------------------------------------------------------------------------

WRK_SCRIPT = """
local bodies = {%s}
local i = 0
request = function()
  i = i %% #bodies + 1
  return wrk.format("POST", "%s", {["Content-Type"] = "application/json"}, bodies[i])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nWRK_RESULT {"requests": %%d, "errors": %%d, "duration_us": %%d, "p50_us": %%d, ' ..
    '"p99_us": %%d}\\n', summary.requests, e.connect + e.read + e.write + e.timeout + e.status,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
"""


#: The paired script: thread ``k`` connects to server ``k`` (its ``Host`` header too) and counts
#: its own answers (wrk's summary adds up the threads; its latency percentiles are not per
#: thread). Give the servers as IP addresses: ``wrk.lookup`` may resolve a name to another
#: family than the one a server listens on.
WRK_PAIRED_SCRIPT = """
local bodies = {%s}
local targets = {%s}
local threads = {}
local i = 0
setup = function(thread)
  local k = #threads + 1
  thread.addr = wrk.lookup(targets[k][1], targets[k][2])[1]
  thread:set("host", targets[k][1] .. ":" .. targets[k][2])
  table.insert(threads, thread)
end
answers, failures = 0, 0
request = function()
  i = i %% #bodies + 1
  return wrk.format("POST", "%s", {["Content-Type"] = "application/json", ["Host"] = host},
                    bodies[i])
end
response = function(status, headers, body)
  answers = answers + 1
  if status ~= 200 then failures = failures + 1 end
end
done = function(summary, latency, requests)
  local e = summary.errors
  local rows = {}
  for k, thread in ipairs(threads) do
    rows[k] = string.format('[%%d, %%d]', thread:get("answers"), thread:get("failures"))
  end
  io.write(string.format(
    '\\nWRK_RESULT {"threads": [%%s], "socket_errors": %%d, "duration_us": %%d}\\n',
    table.concat(rows, ", "), e.connect + e.read + e.write + e.timeout, summary.duration))
end
"""


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def _lua_bodies(sources: list[str]) -> str:
    """One v2 JSON body per source, as Lua long strings (no escaping)."""
    return ", ".join(f"[==[{request_body(s).decode()}]==]" for s in sources)


def wrk_script(path: str, sources: list[str]) -> str:
    """The Lua script: the bodies of :func:`_lua_bodies`, posted in turn."""
    return WRK_SCRIPT % (_lua_bodies(sources), path)


def wrk_paired_script(path: str, sources: list[str], base_urls: list[str]) -> str:
    """The paired Lua script: thread ``k`` posts to ``base_urls[k]``."""
    hosts = [httpx.URL(url) for url in base_urls]
    targets = ", ".join(f'{{"{u.host}", "{u.port}"}}' for u in hosts)
    return WRK_PAIRED_SCRIPT % (_lua_bodies(sources), targets, path)


def _run_wrk(url: str, script: Path, concurrency: int, seconds: float, threads: int = 1) -> dict:
    command = ["wrk", f"-t{threads}", f"-c{concurrency * threads}",
               f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script),
               url]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    for line in result.stdout.splitlines():
        if line.startswith("WRK_RESULT "):
            return json.loads(line.removeprefix("WRK_RESULT "))
    raise RuntimeError(f"wrk failed ({result.returncode}): {result.stderr or result.stdout}")


def _measured_wrk(
    script_text: str,
    url: str,
    concurrency: int,
    duration: float,
    warmup: float,
    pids: list[int],
    threads: int = 1,
) -> tuple[dict, list[float]]:
    """Run ``script_text`` in wrk: a warm-up run, then the measured one. Its ``WRK_RESULT``
    and each of ``pids``' CPU seconds over the measured run."""
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "post_v2.lua"
        script.write_text(script_text)
        if warmup > 0:
            _run_wrk(url, script, concurrency, warmup, threads)
        cpu_before = [cpu_seconds(pid) for pid in pids]
        summary = _run_wrk(url, script, concurrency, duration, threads)
        cpu_after = [cpu_seconds(pid) for pid in pids]
    return summary, [after - before for before, after in zip(cpu_before, cpu_after, strict=True)]


def drive_wrk(
    base_url: str,
    infer_path: str,
    sources: list[str],
    concurrency: int,
    duration: float,
    warmup: float,
    pid: int | None,
) -> Window:
    """One thread, ``concurrency`` connections: a warm-up run, then the measured one; the
    server's CPU seconds when ``pid`` names its process (else NaN)."""
    script = wrk_script(infer_path, sources)
    pids = [] if pid is None else [pid]
    summary, cpu = _measured_wrk(script, base_url, concurrency, duration, warmup, pids)
    server_cpu = cpu[0] if cpu else float("nan")
    return Window(
        requests=summary["requests"],
        errors=summary["errors"],
        mismatches=0,  # not read by wrk
        seconds=summary["duration_us"] / 1e6,
        p50_ms=summary["p50_us"] / 1000,
        p99_ms=summary["p99_us"] / 1000,
        server_cpu_s=server_cpu,
    )


def drive_wrk_paired(
    base_urls: list[str],
    infer_path: str,
    sources: list[str],
    concurrency: int,
    duration: float,
    warmup: float,
    pids: list[int],
) -> list[Window]:
    """One ``wrk`` with a thread per server, ``concurrency`` connections each, all at once: one
    :class:`Window` per server over the same window (no per-server percentiles: NaN). wrk's
    socket errors cannot be told apart by server and count against each."""
    script = wrk_paired_script(infer_path, sources, base_urls)
    summary, server_cpu = _measured_wrk(
        script, base_urls[0], concurrency, duration, warmup, pids, threads=len(base_urls)
    )
    seconds = summary["duration_us"] / 1e6
    return [
        Window(
            requests=answers,
            errors=failures + summary["socket_errors"],
            mismatches=0,
            seconds=seconds,
            p50_ms=float("nan"),
            p99_ms=float("nan"),
            server_cpu_s=cpu,
        )
        for (answers, failures), cpu in zip(summary["threads"], server_cpu, strict=True)
    ]

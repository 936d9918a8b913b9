"""Hostile and edge-case clients against ``python -m serving``: the figures of issue 14.

Starts ``python -m serving`` (on 127.0.0.1, a free port) with a deterministic stand-in model,
``tests/serving_doubles.ReverseRuntime`` that costs ``--cost-us-per-char`` microseconds of
sleep (the GIL released, as onnxruntime does) per padded source character, and measures, each
scenario bounded in count and time:

- ``attention``: a request for the attention maps of 32 sources of 256 characters (2.1 M
  elements): its status, response bytes, the server's peak RSS, and the slowest
  ``/v2/health/ready`` answered while it runs (polled every 20 ms on another connection);
  then the same for 14 such sources (0.92 M elements, under the default output limit);
- ``idle sockets``: with the server at 256 file descriptors, 300 idle connections, then a
  health check: answered or not, and how long it took;
- ``short body``, ``trickled header``, ``silent connection``: how long the server keeps a
  connection that declared 200 body bytes and sent 1, that sends a header byte every 0.5 s,
  that sends nothing (each waited for at most ``--wait-s``);
- ``big header``: a 20 MB header: the status and the RSS it cost;
- ``stalled upload``: a lone client's p50 over 40 requests with ``--max-delay-ms 50``, alone
  and while another client holds an unfinished body;
- ``long request``: the latency of a one-item request sent just after a 256 x 1,024-character
  request (no attention);
- ``failure isolation``: 20 requests batched with one whose runtime call fails: how many of
  the 20 got 500;
- ``broken model``: a model whose every inference fails: is the server ready?
- ``closing``: what a client reads when the server closes on it with its bytes unread, with
  ``--linger-s 0`` (close at once, as before) and the default (the lingering close): 20
  ``http.client`` POSTs of a 16 MB body (413 or a reset?); 20 connections over
  ``--max-connections`` that each send a 4 MB body at once (503 or a reset?), kept open by the
  client, and the server's open sockets after them; and what the lingering costs: one-item
  requests (``--closing-requests``, 2,000 per server), each on a new connection that says
  ``Connection: close``, one after another, to both servers in turns of 250, the servers on
  one core and the client on the other: requests a second and the server's CPU time per
  request (``/proc``), medians;
- ``malformed``: two inference requests and a malformed one in one write, on 20 new
  connections for each kind (a request line, two Content-Lengths, a chunk size, a header
  without a colon, a URL uvicorn cannot split): the statuses read, in order;
- the small ones: ``Content-Type: text/plain``, a foreign ``Host``, ``HEAD
  /v2/health/ready``, ``/openapi.json``, gzip with trailing garbage, two-member gzip, a lone
  surrogate in a source and in ``id``.

Run it against another checkout with ``PYTHONPATH=/path/to/checkout``: the ``serving`` package
comes from there, the stand-in model from this file's repository::

    python benchmarks/probe_hostile.py
    PYTHONPATH=/tmp/old-main python benchmarks/probe_hostile.py
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]

LAUNCHER = """
import os, sys, time
sys.path.insert(0, {tests!r})
import serving.__main__ as cli
from serving_doubles import ReverseRuntime

COST = float(os.environ["PROBE_COST_US"]) * 1e-6
BROKEN = os.environ.get("PROBE_BROKEN") == "1"

class ProbeRuntime(ReverseRuntime):
    def predict_batch(self, sources, temperature=None, with_attention=False):
        if BROKEN:
            raise RuntimeError("this model cannot run")
        time.sleep(COST * len(sources) * max(map(len, sources), default=0))
        return super().predict_batch(sources, temperature, with_attention)

cli._load = lambda *args, **kwargs: ProbeRuntime(max_source_length=1024)  # any _load signature
with open(os.environ["PROBE_WHERE"], "w") as where:
    where.write(cli.__file__)
sys.exit(cli.main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``python -m serving`` in a subprocess, with the probe's stand-in model."""

    def __init__(
        self,
        *flags: str,
        nofile: int | None = None,
        broken: bool = False,
        cost=7.0,
        cpus: set[int] | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory()
        self.where = Path(self._dir.name) / "where"
        env = dict(os.environ, PROBE_COST_US=str(cost), PROBE_BROKEN="1" if broken else "0")
        env["PROBE_WHERE"] = str(self.where)
        launcher = LAUNCHER.format(tests=str(REPO / "tests"))
        argv = [sys.executable, "-c", launcher, "--model-dir", f"reverse={self._dir.name}"]
        argv += ["--port", str(self.port), "--log-level", "error", *flags]

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
            if cpus is not None:  # (before exec: every thread the server starts inherits it)
                os.sched_setaffinity(0, cpus)

        # cwd: not this repository, whose serving/ would come before PYTHONPATH's
        self.process = subprocess.Popen(
            argv,
            env=env,
            cwd=self._dir.name,
            preexec_fn=limit,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait_ready(self, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return True
            time.sleep(0.05)
        return False

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=35)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()
        self._dir.cleanup()

    def __enter__(self) -> Server:
        if not self.wait_ready():
            err = (
                self.process.stderr.read().decode(errors="replace")[-2000:]
                if self.process.poll() is not None
                else ""
            )
            self.close()
            raise RuntimeError(f"the server did not start: {err}")
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def body(sources, outputs=None, **extra) -> dict:
    request = {"inputs": [{"name": "source", "shape": [len(sources)], "datatype": "BYTES"}]}
    request["inputs"][0]["data"] = sources
    if outputs:
        request["outputs"] = [{"name": name} for name in outputs]
    request.update(extra)
    return request


INFER = "/v2/models/reverse/infer"
ROWS: list[tuple[str, str]] = []


def report(name: str, value: str) -> None:
    ROWS.append((name, value))
    print(f"{name:<44} {value}", flush=True)


def health_poller(url: str, stop: threading.Event, worst: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            started = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                client.get("/v2/health/ready")
            worst[0] = max(worst[0], time.monotonic() - started)
            time.sleep(0.02)


def attention(n_items: int, length: int) -> None:
    with Server() as server:
        stop, worst = threading.Event(), [0.0]
        poller = threading.Thread(target=health_poller, args=(server.url, stop, worst))
        poller.start()
        time.sleep(0.1)
        started = time.monotonic()
        request = body(["7" * length] * n_items, ["prediction", "attention"])
        response = httpx.post(server.url + INFER, json=request, timeout=120)
        elapsed = time.monotonic() - started
        stop.set()
        poller.join()
        elements = n_items * length * (length + 1)
        report(
            f"attention {n_items}x{length} ({elements / 1e6:.2f} M elements)",
            f"{response.status_code}, {len(response.content) / 1e6:.1f} MB in {elapsed:.2f} s, "
            f"peak RSS {server.peak_rss_mb():.0f} MB, slowest health {worst[0] * 1000:.0f} ms",
        )


def idle_sockets(wait_s: float) -> None:
    with Server(nofile=256) as server:
        sockets = []
        for _ in range(300):
            sock = socket.socket()
            sock.settimeout(2)
            try:
                sock.connect(("127.0.0.1", server.port))
            except OSError:
                sock.close()
                break
            sockets.append(sock)
        time.sleep(0.3)
        started = time.monotonic()
        try:
            status = httpx.get(server.url + "/v2/health/ready", timeout=wait_s).status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        elapsed = time.monotonic() - started
        report("300 idle sockets, 256 fds: health", f"{status} after {elapsed:.2f} s")
        for sock in sockets:
            sock.close()


def kept_for(server: Server, payload: bytes, wait_s: float, trickle: bytes = b"") -> str:
    """How long the server keeps a connection that sends ``payload`` (then ``trickle``)."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(0.5)
    started = time.monotonic()
    answer = b""
    try:
        sock.sendall(payload)
        index = 0
        while time.monotonic() - started < wait_s:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if trickle:
                    sock.sendall(trickle[index % len(trickle) : index % len(trickle) + 1])
                    index += 1
                continue
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
        else:
            return f"still open after {wait_s:.0f} s"
    finally:
        sock.close()
    status = answer.split(b"\r\n", 1)[0].decode(errors="replace") or "no answer"
    return f"closed after {time.monotonic() - started:.1f} s ({status})"


def slow_connections(wait_s: float) -> None:
    with Server() as server:
        short = (
            b"POST "
            + INFER.encode()
            + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 200\r\n\r\n{"
        )
        report("Content-Length 200, 1 byte sent", kept_for(server, short, wait_s))
        report(
            "header trickled, 1 byte / 0.5 s",
            kept_for(server, b"G", wait_s, b"ET / HTTP/1.1\r\nX: " + b"y" * 1000),
        )
        report("connection that sends nothing", kept_for(server, b"", wait_s))


def big_header(megabytes: int) -> None:
    with Server() as server:
        before = server.peak_rss_mb()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.settimeout(30)
        started = time.monotonic()
        head = b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
        status = "no answer"
        try:
            sock.sendall(head)
            chunk = b"a" * (1 << 20)
            for _ in range(megabytes):
                sock.sendall(chunk)
            sock.sendall(b"\r\n\r\n")
            status = sock.recv(65536).split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
        except OSError as exc:
            with contextlib.suppress(OSError):
                status = sock.recv(65536).split(b"\r\n", 1)[0].decode(errors="replace")
            status = status or type(exc).__name__
        finally:
            sock.close()
        report(
            f"{megabytes} MB header",
            f"{status} after {time.monotonic() - started:.2f} s, "
            f"RSS +{server.peak_rss_mb() - before:.0f} MB",
        )


def outcome(action) -> str:
    """``action()``'s result, or the name of the error it raised."""
    try:
        return action()
    except OSError as exc:
        return type(exc).__name__


def post_big_body(server: Server, size: int) -> str:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", INFER, body=b"x" * size)
        return str(conn.getresponse().status)
    finally:
        conn.close()


def counted(outcomes: list[str]) -> str:
    return ", ".join(f"{outcomes.count(key)} {key}" for key in sorted(set(outcomes)))


def open_sockets(pid: int) -> int:
    return sum(os.readlink(fd).startswith("socket:") for fd in Path(f"/proc/{pid}/fd").iterdir())


def refused_over_capacity(server: Server, count: int) -> tuple[str, int]:
    """``count`` connections over capacity (one connection held part-way through its headers,
    ``--max-connections 1``), each sending a 4 MB upload at once and kept open: their answers'
    statuses, and the server's open sockets after them."""
    held = socket.create_connection(("127.0.0.1", server.port))
    held.sendall(b"GET /v2/health/live HTTP/1.1\r\n")  # not idle: it is never closed for one
    time.sleep(0.2)
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {4 << 20}\r\n\r\n"
    kept, outcomes = [held], []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", server.port))
        kept.append(sock)
        sock.settimeout(10)
        try:
            sock.sendall(head.encode() + b"x" * (4 << 20))
        except OSError:
            pass  # answered and no longer read: the answer may still be there to read
        try:
            answer = sock.recv(65536)
            outcomes.append(answer.split(b" ", 2)[1].decode() if answer else "closed")
        except OSError as exc:
            outcomes.append(type(exc).__name__)
    sockets = open_sockets(server.process.pid)
    for sock in kept:
        sock.close()
    return counted(outcomes), sockets


def closing_requests(server: Server, count: int) -> tuple[float, float]:
    """``count`` one-item requests, each on a new connection that says ``Connection: close``:
    requests a second, and the server's CPU milliseconds per request."""
    from load_clients import cpu_seconds

    payload = json.dumps(body(["abc"])).encode()
    request = (
        f"POST {INFER} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    cpu, started = cpu_seconds(server.process.pid), time.monotonic()
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
    elapsed = time.monotonic() - started
    return count / elapsed, 1000 * (cpu_seconds(server.process.pid) - cpu) / count


def closing(requests: int, rounds: int = 8) -> None:
    """The lingering close against closing at once (``--linger-s 0``), side by side; the cost
    from both servers up at once (on one core, the client on the other), measured in turns
    (``rounds`` windows each, the order flipped each round), as medians."""
    for linger in ("0", "30"):
        label = f"--linger-s {linger}"
        with Server("--linger-s", linger) as server:
            bodies = [outcome(lambda s=server: post_big_body(s, 16 << 20)) for _ in range(20)]
            report(f"{label}: 16 MB bodies (http.client)", counted(bodies))
        with Server(
            "--linger-s", linger, "--max-connections", "1", "--health-connections", "0"
        ) as server:
            answers, sockets = refused_over_capacity(server, 20)
            report(f"{label}: 20 uploads over capacity", f"{answers}; {sockets} sockets open")
    cores = sorted(os.sched_getaffinity(0))
    server_cpus, client_cpus = ({cores[0]}, {cores[1]}) if len(cores) > 1 else (None, None)
    window = max(requests // rounds, 1)
    before = os.sched_getaffinity(0)
    with (
        Server("--linger-s", "0", cpus=server_cpus) as at_once,
        Server("--linger-s", "30", cpus=server_cpus) as lingering,
    ):
        if client_cpus is not None:
            os.sched_setaffinity(0, client_cpus)
        try:
            servers = {"0": at_once, "30": lingering}
            for server in servers.values():
                closing_requests(server, 200)  # warm-up
            windows: dict[str, list[tuple[float, float]]] = {"0": [], "30": []}
            for turn in range(rounds):
                for linger in ("0", "30") if turn % 2 == 0 else ("30", "0"):
                    windows[linger].append(closing_requests(servers[linger], window))
        finally:
            os.sched_setaffinity(0, before)
    for linger, measured in windows.items():
        rate = statistics.median(rate for rate, _ in measured)
        cpu_ms = statistics.median(cpu for _, cpu in measured)
        report(
            f"--linger-s {linger}: Connection: close requests",
            f"{rate:.0f} req/s, server {cpu_ms:.3f} ms CPU/request (medians of {rounds} x "
            f"{window})",
        )
    rate_ratios = [a[0] / b[0] for a, b in zip(windows["30"], windows["0"], strict=True)]
    cpu_ratios = [a[1] / b[1] for a, b in zip(windows["30"], windows["0"], strict=True)]
    report(
        "lingering / at once, median of the rounds",
        f"req/s {statistics.median(rate_ratios):.3f}x (range {min(rate_ratios):.2f}-"
        f"{max(rate_ratios):.2f}), CPU {statistics.median(cpu_ratios):.3f}x (range "
        f"{min(cpu_ratios):.2f}-{max(cpu_ratios):.2f})",
    )


def stalled_upload() -> None:
    with Server("--max-delay-ms", "50") as server:

        def p50() -> float:
            times = []
            with httpx.Client(base_url=server.url, timeout=10) as client:
                for _ in range(40):
                    started = time.monotonic()
                    client.post(INFER, json=body(["12345"]))
                    times.append(time.monotonic() - started)
            return statistics.median(times) * 1000

        alone = p50()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(
            b"POST "
            + INFER.encode()
            + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 200\r\n\r\n{"
        )
        time.sleep(0.1)
        stalled = p50()
        sock.close()
        report(
            "lone client p50, --max-delay-ms 50",
            f"{alone:.1f} ms alone, {stalled:.1f} ms beside a stalled upload",
        )


def long_request() -> None:
    with Server() as server, httpx.Client(base_url=server.url, timeout=60) as client:
        long_body = body(["7" * 1024] * 256)
        thread = threading.Thread(target=client.post, args=(INFER,), kwargs={"json": long_body})
        thread.start()
        time.sleep(0.15)  # the long request is queued and running
        started = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=60) as other:
            other.post(INFER, json=body(["12345"]))
        short = time.monotonic() - started
        thread.join()
        report("1-item request behind 256 x 1,024 chars", f"{short * 1000:.0f} ms")


def failure_isolation() -> None:
    with Server("--max-delay-ms", "50", "--no-eager-batching") as server:
        results = []

        def post(source: str) -> None:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                results.append((source, client.post(INFER, json=body([source])).status_code))

        threads = [threading.Thread(target=post, args=(f"{i:05d}",)) for i in range(20)]
        threads.append(threading.Thread(target=post, args=("boom",)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        innocent = sum(1 for source, status in results if source != "boom" and status == 500)
        bad = [status for source, status in results if source == "boom"]
        report(
            "innocent requests failed with a bad one", f"{innocent} of 20 (the bad one: {bad[0]})"
        )


def broken_model() -> None:
    server = Server(broken=True)
    try:
        ready = server.wait_ready(timeout=10)
        code = server.process.poll()
        report("model whose every inference fails", f"ready={ready}, exit status {code}")
    finally:
        server.close()


#: Requests that do not parse (a request line, two lengths, a chunk size, a header, a URL
#: uvicorn cannot split), each sent behind two valid ones in one write by ``malformed``.
MALFORMED = {
    "request line": b"GET /v2/health/ready HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    "two lengths": b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Content-Length: 3\r\n\r\n{}" % INFER.encode(),
    "chunk size": b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\n{}\r\n0\r\n\r\n" % INFER.encode(),
    "header": b"GET /v2/health/ready HTTP/1.1\r\nHost x\r\n\r\n",
    "URL": b"GET http://h:/ HTTP/1.1\r\nHost: x\r\n\r\n",
}


def pipelined_with_malformed(server: Server, malformed: bytes) -> str:
    """Two inference requests and ``malformed`` in one write on a new connection: the statuses
    read, in order, until the server closes (``+`` joins them; ``reset`` or ``open`` if so)."""
    requests = b""
    for sources in (["abc"], ["hello", "xy"]):
        payload = json.dumps(body(sources)).encode()
        requests += b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (INFER.encode(), server.port)
        requests += b"Content-Type: application/json\r\n"
        requests += b"Content-Length: %d\r\n\r\n" % len(payload) + payload
    data, end = b"", ""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(requests + malformed)
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            end = "+reset"
        except TimeoutError:
            end = "+open"
    statuses = []
    while data.startswith(b"HTTP/1.1 "):  # each answer by its Content-Length
        head, _, rest = data.partition(b"\r\n\r\n")
        statuses.append(head.split()[1].decode())
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        data = rest[length:]
    return "+".join(statuses) + end


def malformed(connections: int = 20) -> None:
    """``connections`` of ``pipelined_with_malformed`` for each kind of malformed request."""
    with Server() as server:
        for kind, request in MALFORMED.items():
            reads = [pipelined_with_malformed(server, request) for _ in range(connections)]
            report(f"2 requests, then a malformed {kind}", counted(reads))


def small_ones() -> None:
    with Server() as server, httpx.Client(base_url=server.url, timeout=10) as client:
        plain = json.dumps(body(["123"]))
        status = client.post(
            INFER, content=plain, headers={"Content-Type": "text/plain"}
        ).status_code
        report("POST Content-Type: text/plain", str(status))
        status = client.get("/metrics", headers={"Host": "evil.example"}).status_code
        report("GET /metrics, Host: evil.example", str(status))
        report("HEAD /v2/health/ready", str(client.head("/v2/health/ready").status_code))
        report("GET /openapi.json", str(client.get("/openapi.json").status_code))
        gz = gzip.compress(plain.encode())
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        status = client.post(INFER, content=gz + b"garbage", headers=headers).status_code
        report("gzip + trailing garbage", str(status))
        half = len(plain) // 2
        two = gzip.compress(plain[:half].encode()) + gzip.compress(plain[half:].encode())
        report("two-member gzip", str(client.post(INFER, content=two, headers=headers).status_code))
        tensor = '{"name": "source", "shape": [1], "datatype": "BYTES", "data": [%s]}'
        raw = '{"inputs": [%s]}' % (tensor % '"\\ud800"')
        json_headers = {"Content-Type": "application/json"}
        status = client.post(INFER, content=raw, headers=json_headers).status_code
        report("lone surrogate in a source", str(status))
        raw = '{"id": "\\ud800", "inputs": [%s]}' % (tensor % '"1"')
        report(
            "lone surrogate in id",
            str(client.post(INFER, content=raw, headers=json_headers).status_code),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wait-s", type=float, default=15.0, help="longest wait per connection")
    parser.add_argument("--header-mb", type=int, default=20)
    parser.add_argument("--only", nargs="*", help="run only these scenarios")
    parser.add_argument(
        "--closing-requests", type=int, default=2000, help="Connection: close requests per server"
    )
    args = parser.parse_args()
    scenarios = {
        "attention": lambda: (attention(32, 256), attention(14, 256)),
        "idle": lambda: idle_sockets(args.wait_s),
        "slow": lambda: slow_connections(args.wait_s),
        "header": lambda: big_header(args.header_mb),
        "stalled": stalled_upload,
        "long": long_request,
        "isolation": failure_isolation,
        "broken": broken_model,
        "small": small_ones,
        "closing": lambda: closing(args.closing_requests),
        "malformed": malformed,
    }
    with Server() as server:
        print(f"server's serving package: {Path(server.where.read_text()).parent}")
    for name, scenario in scenarios.items():
        if args.only and name not in args.only:
            continue
        try:
            scenario()
        except Exception as exc:  # one scenario's failure must not hide the others' figures
            report(name, f"probe failed: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()

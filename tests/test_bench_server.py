"""benchmarks/bench_server.py's repeated windows (``--repeats`` is checked, and the ratios are
taken from each level's median window; the full load test runs in gpu_check's test), the paired
load generators of benchmarks/load_clients.py against real local HTTP servers, and
benchmarks/bench_batcher_overhead.py."""

import asyncio
import json
import os
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_server  # noqa: E402
import load_clients  # noqa: E402


def window(mode: str, throughput: float, cpu_ms: float, p99_ms: float = 5.0, **labels):
    fields = dict(model="reversal", client="python", mix="fixed", concurrency=1)
    fields.update(labels)
    return bench_server.LevelResult(
        mode=mode,
        requests=100,
        errors=0,
        mismatches=0,
        seconds=1.0,
        throughput=throughput,
        p50_ms=2.0,
        p99_ms=p99_ms,
        server_cpu_ms=cpu_ms,
        **fields,
    )


def test_repeats_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        bench_server.parse_args(["--repeats", "0"])
    assert "--repeats must be >= 1" in capsys.readouterr().err
    assert bench_server.parse_args(["--repeats", "3"]).repeats == 3


def test_quick_changes_defaults_and_the_flags_given_win():
    """--quick overwrote --models, --concurrency, --duration and --warmup given with it."""
    given = ["--quick", "--models", "g2p", "--concurrency", "256", "--duration", "10"]
    args = bench_server.parse_args([*given, "--warmup", "3", "--server-warmup", "0"])
    assert (args.models, args.concurrency, args.duration) == (["g2p"], [256], 10.0)
    assert (args.warmup, args.server_warmup) == (3.0, 0.0)
    quick, full = bench_server.parse_args(["--quick"]), bench_server.parse_args([])
    assert (quick.models, quick.concurrency, quick.duration) == (["reversal"], [1, 8, 64], 2.0)
    assert (full.models, full.concurrency, full.duration) == (
        ["g2p", "reversal"],
        [1, 8, 64, 256],
        5.0,
    )
    with pytest.raises(SystemExit):
        bench_server.parse_args(["--quick", "--duration", "0"])  # checked after the defaults


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--concurrency", "8", "0"], "--concurrency must be >= 1"),
        (["--duration", "0"], "--duration must be a finite number > 0"),
        (["--duration", "nan"], "--duration must be a finite number > 0"),
        (["--warmup", "-5"], "--warmup must be a finite number >= 0"),
        (["--server-warmup", "inf"], "--server-warmup must be a finite number >= 0"),
    ],
)
def test_meaningless_load_settings_are_refused(argv, words, capsys):
    """Each gave a table of empty windows (0 req/s) and exit status 0."""
    with pytest.raises(SystemExit):
        bench_server.parse_args(argv)
    assert words in capsys.readouterr().err


def test_each_level_reads_its_median_window():
    results = [
        window("batched", 300.0, 2.0, 9.0),
        window("batched", 100.0, 9.0, 1.0),  # an outlier window either way
        window("batched", 310.0, 2.1, 6.0),
        window("unbatched", 320.0, 2.2),
        window("batched", 50.0, 1.0, concurrency=8),  # other levels: not mixed in
        window("batched", 60.0, 1.0, mix="mixed"),
        window("batched", 70.0, 1.0, client="wrk"),
        window("batched", 80.0, 1.0, model="g2p"),
    ]
    medians = bench_server.median_results(results)
    level = medians[("reversal", "python", "fixed", 1, "batched")]
    assert (level.throughput, level.server_cpu_ms, level.p99_ms) == (300.0, 2.1, 6.0)
    assert (level.requests, level.seconds) == (300, 3.0)  # summed over the three windows
    assert medians[("reversal", "python", "fixed", 8, "batched")].throughput == 50.0
    assert medians[("reversal", "python", "mixed", 1, "batched")].throughput == 60.0
    assert medians[("reversal", "wrk", "fixed", 1, "batched")].throughput == 70.0
    assert medians[("g2p", "python", "fixed", 1, "batched")].throughput == 80.0
    assert len(medians) == 6


def test_every_repeat_flips_the_modes_order():
    modes = ["batched", "unbatched"]
    assert [bench_server.mode_order(modes, 0, r)[0] for r in range(3)] == [
        "batched",
        "unbatched",
        "batched",
    ]
    assert bench_server.mode_order(modes, 1, 0) == ["unbatched", "batched"]  # the next turn
    assert modes == ["batched", "unbatched"]  # not reordered in place


def test_ratios_come_from_the_medians(capsys):
    results = [window("batched", t, 2.0) for t in (300.0, 100.0, 310.0)]
    results.append(window("unbatched", 300.0, 2.0))
    bench_server.print_ratios(results)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("reversal"))
    assert line.split()[4] == "1.00x"  # 300 / 300, not the mean 236.7 / 300
    assert line.split()[5] == "1.000x"  # CPU a request: three decimals (the 1/4 goal's bound)


def test_the_aged_server_runs_when_named_and_is_compared_with_dynamic_batching(capsys):
    assert "aged" not in bench_server.parse_args([]).modes  # the three designs by default
    args = bench_server.parse_args(["--modes", "batched", "aged", "--connection-age", "2"])
    assert (args.modes, args.connection_age) == (["batched", "aged"], 2.0)
    bench_server.print_ratios([window("batched", 400.0, 2.0), window("aged", 380.0, 2.2)])
    out = capsys.readouterr().out
    assert "aged / batched" in out
    for bad in ("0", "nan", "-2"):
        with pytest.raises(SystemExit):
            bench_server.parse_args(["--connection-age", bad])
    assert "--connection-age must be seconds" in capsys.readouterr().err
    line = next(x for x in out.splitlines() if x.startswith("reversal"))
    assert line.split()[4:6] == ["0.95x", "1.100x"]


def test_the_batcher_overhead_benchmark_alternates_sizes_and_prints_their_ratio(
    capsys, monkeypatch
):
    import bench_batcher_overhead

    sizes = []

    class Recording(bench_batcher_overhead.Batcher):
        def __init__(self, runtime, **kwargs):
            sizes.append(kwargs["max_batch_size"])
            super().__init__(runtime, **kwargs)

    monkeypatch.setattr(bench_batcher_overhead, "Batcher", Recording)
    assert bench_batcher_overhead.main(["--requests", "50", "--repeats", "3"]) == 0
    assert sizes == [64, 1, 1, 64, 64, 1]
    out = capsys.readouterr().out.splitlines()
    rows = {int(line.split()[0]): [float(x) for x in line.split()[1:]] for line in out[1:3]}
    assert set(rows) == {64, 1} and all(x > 0 for row in rows.values() for x in row)
    cpu_ratio = float(out[-1].split()[4].rstrip("x"))  # "64 / 1: cpu 0.99x  wall ..."
    assert abs(cpu_ratio - rows[64][0] / rows[1][0]) <= 0.01  # printed to 0.1 us, 0.01x


@contextmanager
def v2_server(answer):
    """A local HTTP server answering v2 JSON infer posts with ``answer(source)``: a reversed
    source (right), anything else (wrong), or None (HTTP 500)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            output = answer(body["inputs"][0]["data"][0])
            status = 500 if output is None else 200
            payload = {"error": "no"} if output is None else {
                "outputs": [{"name": "output", "shape": [1], "datatype": "BYTES", "data": [output]}]
            }  # fmt: skip
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


SOURCES = ["abc", "hello", "xy", "qrstu"]
EXPECTED = {s: s[::-1] for s in SOURCES}


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_paired_python_client_drives_every_server_at_once(concurrency):
    with (
        v2_server(lambda s: s[::-1]) as right,
        v2_server(lambda s: s.upper()) as wrong,
        v2_server(lambda s: None) as failing,
    ):
        urls = [f"{base}/v2/models/m/infer" for base in (right, wrong, failing)]
        windows = asyncio.run(
            load_clients.drive_python_paired(
                urls, SOURCES, EXPECTED, concurrency, 0.6, 0.1, [os.getpid()] * 3
            )
        )
    counts = [w.requests for w in windows]
    assert min(counts) > 0
    assert [w.mismatches for w in windows] == [0, counts[1], 0]
    assert [w.errors for w in windows] == [0, 0, counts[2]]
    assert max(w.seconds for w in windows) - min(w.seconds for w in windows) < 0.1  # one window
    for w in windows:
        assert w.seconds == pytest.approx(0.6, abs=0.2) and w.p50_ms <= w.p99_ms
        assert w.server_cpu_s >= 0
        # each server's coroutines were always waiting on it: its summed latency fills the
        # window concurrency times over (Little's law)
        mean_latency = w.seconds * concurrency / w.requests
        assert w.p50_ms / 1000 <= 3 * mean_latency


def test_the_paired_wrk_script_gives_each_thread_its_server():
    script = load_clients.wrk_paired_script(
        "/v2/models/m/infer", ["ab"], ["http://127.0.0.1:8001", "http://localhost:9002"]
    )
    assert 'local targets = {{"127.0.0.1", "8001"}, {"localhost", "9002"}}' in script
    assert '"POST", "/v2/models/m/infer"' in script and "thread.addr = wrk.lookup" in script
    assert '["Host"] = host' in script  # each thread names its own server


@pytest.mark.skipif(not load_clients.wrk_available(), reason="wrk is not installed")
def test_paired_wrk_drives_every_server_at_once_and_counts_each_ones_failures():
    with v2_server(lambda s: s[::-1]) as right, v2_server(lambda s: None) as failing:
        windows = load_clients.drive_wrk_paired(
            [right, failing], "/v2/models/m/infer", SOURCES, 1, 1.0, 0.0, [os.getpid()] * 2
        )
    assert all(w.requests > 0 for w in windows)
    assert windows[0].errors == 0 and windows[1].errors == windows[1].requests
    assert windows[0].seconds == windows[1].seconds  # one window for both


def test_paired_is_an_option():
    assert bench_server.parse_args(["--paired"]).paired
    assert not bench_server.parse_args([]).paired


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_lean_python_client_reads_and_checks_every_answer(concurrency):
    windows = []
    for answer in (lambda s: s[::-1], lambda s: s.upper(), lambda s: None):
        with v2_server(answer) as base:
            windows.append(asyncio.run(load_clients.drive_python(
                f"{base}/v2/models/m/infer", SOURCES, EXPECTED, concurrency, 0.5, 0.1, lean=True
            )))  # fmt: skip
    counts = [w.requests for w in windows]
    assert min(counts) > 0
    assert [w.mismatches for w in windows] == [0, counts[1], 0]
    assert [w.errors for w in windows] == [0, 0, counts[2]]


def test_a_lean_connection_fails_cleanly_and_reconnects():
    """A chunked answer, a body cut short, an answer without Content-Length and a bad status
    line are ConnectionErrors; the next post opens a new connection; ``Connection: close`` is
    honoured; a 204 has no body."""
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # then the server closes
        b"HTTP/1.1 200 OK\r\n\r\n{}",  # no length: the body cannot be delimited
        b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 503 Busy\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes",
    ]
    connections, requests = [], []

    async def handle(reader, writer):
        connections.append(writer)
        try:
            while answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                requests.append(head + await reader.readexactly(length))
                answer = answers.pop(0)
                writer.write(answer)
                await writer.drain()
                if b"short" in answer or b"chunked" in answer or b"close" in answer:
                    return
        except asyncio.IncompleteReadError:  # the client closed its end
            pass
        finally:
            writer.close()

    async def scenario():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/v2/models/m/infer?x=1"
        connection = load_clients.LeanConnection(url)
        results = []
        for _ in range(8):
            try:
                results.append(await connection.post(b"{}"))
            except ConnectionError as error:
                results.append(type(error).__name__)
        await connection.aclose()
        server.close()
        await server.wait_closed()
        return results, port

    results, port = asyncio.run(scenario())
    failed = "ConnectionError"
    assert results == [
        (200, b"ok"), failed, failed, failed, failed, (503, b"x"), (204, b""), (200, b"yes")
    ]  # fmt: skip
    assert len(connections) == 6  # reconnected after each failure and after the close
    assert requests[0].startswith(b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n".encode() in requests[0] and requests[0].endswith(b"{}")


def test_a_lean_connection_times_out_and_names_its_urls_kind():
    async def silent(reader, writer):
        try:
            await reader.read(1 << 16)  # reads the request, never answers
            await reader.read(1)  # until the client closes its end
        finally:
            writer.close()

    async def scenario():
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = load_clients.LeanConnection(f"http://127.0.0.1:{port}/", timeout=0.2)
        try:
            with pytest.raises(ConnectionError, match="TimeoutError"):
                await connection.post(b"{}")
            assert connection.writer is None  # closed: the next post starts afresh
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())
    with pytest.raises(ValueError, match="http:// URL"):
        load_clients.LeanConnection("https://127.0.0.1:8000/")
    ipv6 = load_clients.LeanConnection("http://[::1]:8000/v2")
    assert b"Host: [::1]:8000\r\n" in ipv6.head and ipv6.host == "::1"


def test_the_stock_and_lean_clients_are_one_or_the_other():
    with pytest.raises(ValueError, match="stock and lean"):
        asyncio.run(load_clients.drive_python("http://x/", SOURCES, EXPECTED, 1, 0.1, 0.0,
                                              stock=True, lean=True))  # fmt: skip

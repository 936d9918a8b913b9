"""benchmarks/profile_server.py: reading py-spy's raw stacks and the server's /metrics."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import profile_server  # noqa: E402

RAW = """\
thread (3860): MainThread;run (base_events.py:600);_run_once (b.py:19);select (selectors.py:468) 30
thread (3860): MainThread;run (base_events.py:600);handle (routes.py:80) 12
thread (3861): ThreadPoolExecutor-0_0;_worker (thread.py:83);run (sessions.py:120) 40
thread (3862);f (a.py:1) 2
"""

METRICS = """\
# HELP skattn_batch_size Items per onnxruntime batch
skattn_batch_size_bucket{le="1.0",model="bench"} 7.0
skattn_batch_size_bucket{le="2.0",model="bench"} 9.0
skattn_batch_size_count{model="bench"} 10.0
skattn_batch_size_sum{model="bench"} 25.0
skattn_inference_seconds_sum{model="bench"} 0.5
skattn_requests_total{model="bench",outcome="ok"} 25.0
"""


def test_stacks_are_counted_per_thread_by_leaf_function(tmp_path):
    path = tmp_path / "raw.txt"
    path.write_text(RAW)
    stacks = profile_server.read_stacks(path)
    assert stacks["MainThread"] == {"select (selectors.py)": 30, "handle (routes.py)": 12}
    assert stacks["ThreadPoolExecutor-0_0"] == {"run (sessions.py)": 40}
    assert stacks["thread 3862"] == {"f (a.py)": 2}
    assert profile_server.read_stacks(tmp_path / "missing.txt") == {}


def test_metrics_sum_the_series_and_count_batches_of_one(monkeypatch):
    class Response:
        text = METRICS
        status = 200

        @classmethod
        def raise_for_status(cls):
            if cls.status != 200:
                raise RuntimeError(f"status {cls.status}")

    monkeypatch.setattr(profile_server.httpx, "get", lambda url, timeout: Response)
    values = profile_server.metrics("http://127.0.0.1:1")
    assert values["skattn_batch_size_count"] == 10.0
    assert values["skattn_batch_size_sum"] == 25.0
    assert values["batch_ones"] == 7.0
    assert values["skattn_inference_seconds_sum"] == 0.5
    assert values["skattn_requests_total"] == 25.0
    Response.status = 503  # connections full: an error, not a server with no batches
    with pytest.raises(RuntimeError, match="503"):
        profile_server.metrics("http://127.0.0.1:1")


def test_each_mode_starts_its_own_server(monkeypatch, tmp_path):
    """The unbatched row must come from a server started with --max-batch-size 1: until
    d4c6764 run_mode passed the batch size where bench_server.running_server takes the mode's
    name, so both rows were the batched server's."""
    started = []

    class Started(Exception):
        pass

    def running_server(model_dir, mode, args):
        started.append(mode)  # running_server starts "unbatched" with --max-batch-size 1
        raise Started

    monkeypatch.setattr(profile_server, "running_server", running_server)
    args = profile_server.parse_args(["--no-py-spy"])
    for mode in ("batched", "unbatched"):
        try:
            profile_server.run_mode(mode, tmp_path, [], {}, args, tmp_path)
        except Started:
            pass
    assert started == ["batched", "unbatched"]

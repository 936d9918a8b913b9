"""The HTTP server (serving.app, serving.protocol, serving.__main__): the Open Inference Protocol
through tritonclient and raw HTTP, limits and errors, metrics, disconnects and SIGTERM.

Most tests run the app in uvicorn on a thread with a deterministic test-double runtime; the
tests at the end serve a real exported model.
"""

import asyncio
import concurrent.futures
import gc
import gzip
import json
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from serving_doubles import WARMUP_SOURCE, ReverseRuntime, reverse_attention

from serving import protocol
from serving.__main__ import build_parser, main
from serving.app import ServerSettings, create_app
from serving.connections import uvicorn_config
from serving.process import JsonFormatter

REPO = Path(__file__).resolve().parents[1]
MODEL = "reverse"


# ---------------------------------------------------------------------------------------------
# Harness: the app in uvicorn on a thread, on a port of its own


class RunningServer:
    def __init__(self, runtime, settings, limits=None, http_impl="auto"):
        self.runtime = runtime
        self.app = create_app({MODEL: runtime}, settings)
        # proto=IPPROTO_TCP, so that asyncio sets TCP_NODELAY on accepted connections
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn_config(
            self.app,
            limits,
            http_impl=http_impl,
            log_config=None,
            access_log=False,
            lifespan="on",
            log_level="warning",
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        release = getattr(self.runtime, "release", None)
        if release is not None:  # a held test double: let it finish
            release()
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    @property
    def batcher(self):
        return self.app.state.models[MODEL].batcher

    def triton(self):
        return triton.InferenceServerClient(url=f"127.0.0.1:{self.port}", network_timeout=20)

    def metric(self, name, **labels):
        """A sample's value from /metrics (0.0 if absent)."""
        text = httpx.get(f"{self.url}/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return sample.value
        return 0.0


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def one_item_requests_at_once(server, sources) -> list:
    """Post each source as a request of its own, all at once; the answers, in order (each
    request must succeed)."""

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

            async def one(source):
                response = await client.post(f"/v2/models/{MODEL}/infer", json=infer_body([source]))
                assert response.status_code == 200, response.text
                return response.json()["outputs"][0]["data"][0]

            return await asyncio.gather(*(one(s) for s in sources))

    return asyncio.run(scenario())


def infer_body(sources, **extra):
    body = {"inputs": [{"name": "source", "shape": [len(sources)], "datatype": "BYTES"}]}
    body["inputs"][0]["data"] = sources
    body.update(extra)
    return body


def source_input(sources, binary=True):
    tensor = triton.InferInput("source", [len(sources)], "BYTES")
    tensor.set_data_from_numpy(np.array(sources, dtype=object), binary_data=binary)
    return tensor


# ---------------------------------------------------------------------------------------------
# The protocol through tritonclient


def test_health_and_metadata_through_tritonclient(serve):
    server = serve()
    client = server.triton()
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready(MODEL)
        assert not client.is_model_ready("nope")
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        meta = client.get_model_metadata(MODEL)
    finally:
        client.close()
    assert meta["name"] == MODEL
    assert meta["inputs"] == [{"name": "source", "datatype": "BYTES", "shape": [-1]}]
    outputs = {o["name"]: (o["datatype"], o["shape"]) for o in meta["outputs"]}
    assert outputs == {
        "prediction": ("BYTES", [-1]),
        "attention": ("FP32", [-1, -1, -1]),
        "attention_lengths": ("INT32", [-1, 2]),
    }
    assert meta["parameters"]["max_source_length"] == 32


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_through_tritonclient(serve, binary):
    server = serve()
    sources = ["hello", "", "héllo wörld", "日本語", "a b"]
    client = server.triton()
    try:
        result = client.infer(
            MODEL,
            [source_input(sources, binary)],
            outputs=[triton.InferRequestedOutput("prediction", binary_data=binary)],
            request_id="req-7",
        )
    finally:
        client.close()
    predictions = result.as_numpy("prediction")
    assert predictions.shape == (5,)
    # tritonclient gives bytes for binary BYTES outputs, str for JSON ones
    texts = [p.decode() if isinstance(p, bytes) else p for p in predictions]
    assert texts == [s[::-1] for s in sources]
    assert result.get_response()["id"] == "req-7"
    assert result.as_numpy("attention") is None  # not asked for


def test_tritonclient_defaults_binary_input_and_output_and_gzip(serve):
    server = serve()
    client = server.triton()
    try:
        result = client.infer(MODEL, [source_input(["abc"])], request_compression_algorithm="gzip")
    finally:
        client.close()
    assert result.get_output("prediction")["parameters"]["binary_data_size"] == 4 + 3
    assert result.as_numpy("prediction").tolist() == [b"cba"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_attention_maps_when_asked_for_by_name(serve, binary):
    server = serve()
    sources = ["abc", "hello", ""]
    client = server.triton()
    try:
        result = client.infer(
            MODEL,
            [source_input(sources)],
            outputs=[
                triton.InferRequestedOutput(name, binary_data=binary)
                for name in ("prediction", "attention", "attention_lengths")
            ],
        )
    finally:
        client.close()
    attention = result.as_numpy("attention")
    lengths = result.as_numpy("attention_lengths")
    assert attention.dtype == np.float32 and attention.shape == (3, 5, 6)
    assert lengths.dtype == np.int32 and lengths.tolist() == [[3, 4], [5, 6], [0, 1]]
    for i, source in enumerate(sources):
        t_y, t_x = lengths[i]
        np.testing.assert_allclose(attention[i, :t_y, :t_x], reverse_attention(source), rtol=1e-6)
        assert not attention[i, t_y:].any() and not attention[i, :, t_x:].any()  # zero padding


def test_temperature_parameter_reaches_the_runtime(serve):
    server = serve()
    client = server.triton()
    try:
        result = client.infer(
            MODEL,
            [source_input(["abcd"])],
            outputs=[triton.InferRequestedOutput("attention")],
            parameters={"temperature": 0.25},
        )
    finally:
        client.close()
    assert server.runtime.calls[-1][1:] == (0.25, True)
    np.testing.assert_allclose(result.as_numpy("attention")[0], reverse_attention("abcd", 0.25))


def test_plain_json_over_http(serve):
    server = serve()
    response = httpx.post(
        f"{server.url}/v2/models/{MODEL}/versions/1/infer",
        json=infer_body(["ab", "xyz"], id="r1", outputs=[{"name": "attention_lengths"}]),
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "model_name": MODEL,
        "model_version": "1",
        "id": "r1",
        "outputs": [
            {
                "name": "attention_lengths",
                "datatype": "INT32",
                "shape": [2, 2],
                "data": [2, 3, 3, 4],
            }
        ],
    }


def test_token_predictions_are_sent_joined_by_spaces(serve):
    class TokenRuntime(ReverseRuntime):
        def predict_batch(self, sources, temperature=None, with_attention=False):
            predictions, attentions = super().predict_batch(sources, temperature, with_attention)
            return [list(p) for p in predictions], attentions

    runtime = TokenRuntime()
    runtime.output_kind = "tokens"
    server = serve(runtime)
    response = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=infer_body(["abc"]))
    assert response.json()["outputs"][0]["data"] == ["c b a"]
    meta = httpx.get(f"{server.url}/v2/models/{MODEL}").json()
    assert meta["parameters"]["output_kind"] == "tokens"


# ---------------------------------------------------------------------------------------------
# Limits and errors: {"error": message} with the right status


def binary_request(raw, n_items=1, declared_size=None, header_length=None):
    """A binary-extension request whose source tensor is ``raw`` (serialized BYTES)."""
    size = len(raw) if declared_size is None else declared_size
    tensor = {"name": "source", "shape": [n_items], "datatype": "BYTES"}
    tensor["parameters"] = {"binary_data_size": size}
    header = json.dumps({"inputs": [tensor]}).encode()
    length = len(header) if header_length is None else header_length
    return header + raw, {protocol.HEADER_LENGTH: str(length)}


def element(text: bytes) -> bytes:
    return protocol.serialize_bytes_tensor([text])


BAD_REQUESTS = {
    "invalid json": (b"{not json", {}, 400, "invalid JSON"),
    "not an object": (b"[1, 2]", {}, 400, "JSON object"),
    "missing input": (json.dumps({"inputs": []}).encode(), {}, 400, "missing input 'source'"),
    "unknown input": (
        json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES"}]}).encode(),
        {},
        400,
        "unknown input 'text'",
    ),
    "wrong datatype": (
        json.dumps(
            {"inputs": [{"name": "source", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        ).encode(),
        {},
        400,
        "expected 'BYTES'",
    ),
    "shape mismatch": (
        json.dumps(
            {"inputs": [{"name": "source", "shape": [3], "datatype": "BYTES", "data": ["a"]}]}
        ).encode(),
        {},
        400,
        "shape mismatch",
    ),
    "two dimensions": (
        json.dumps(
            {"inputs": [{"name": "source", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}]}
        ).encode(),
        {},
        400,
        "one dimension",
    ),
    "number in BYTES data": (json.dumps(infer_body([3])).encode(), {}, 400, "must be strings"),
    "unknown output": (
        json.dumps(infer_body(["a"], outputs=[{"name": "logits"}])).encode(),
        {},
        400,
        "unknown output 'logits'",
    ),
    "bad temperature": (
        json.dumps(infer_body(["a"], parameters={"temperature": -1})).encode(),
        {},
        400,
        "temperature",
    ),
    "source too long": (json.dumps(infer_body(["x" * 33])).encode(), {}, 400, "item 0"),
    "too many items": (json.dumps(infer_body(["a"] * 9)).encode(), {}, 413, "at most 8"),
    "binary size mismatch": (*binary_request(element(b"abc"), declared_size=5), 400, "5"),
    "binary cut inside an element": (*binary_request(element(b"abcdef")[:-2]), 400, "ends inside"),
    "binary count mismatch": (*binary_request(element(b"a") * 2), 400, "shape mismatch"),
    "header length past the body": (*binary_request(element(b"a"), header_length=999), 400, "body"),
    **{
        f"header length {text!r}": (
            *binary_request(element(b"a"), header_length=text),
            400,
            "must be a decimal integer",
        )
        for text in ("1_0", "+10", "ten", "-1")
    },
    "invalid UTF-8": (*binary_request(element(b"\xff\xfe")), 400, "UTF-8"),
    "unknown encoding": (b"{}", {"Content-Encoding": "br"}, 415, "Content-Encoding"),
    "JSON nested too deeply": (b"[" * 50_000, {}, 400, "nested too deeply"),
    "an integer past Python's limit": (b'{"x": ' + b"9" * 5000 + b"}", {}, 400, "invalid JSON"),
    "a 400-digit temperature": (
        json.dumps(infer_body(["a"], parameters={"temperature": 10**400})).encode(),
        {},
        400,
        "temperature",
    ),
    "a lone surrogate in the id": (
        json.dumps({"id": "\ud800", **infer_body(["a"])}).encode(),
        {},
        400,
        "'id'",
    ),
}


def test_a_header_length_in_another_scripts_digits_is_refused():
    body, _ = binary_request(element(b"a"))
    with pytest.raises(protocol.ProtocolError, match="must be a decimal integer"):
        protocol.parse_infer_request(body, "\u0661\u0660", max_items=8)  # int() reads 10


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_get_a_json_error_and_never_reach_the_runtime(serve, case):
    body, headers, status, message = BAD_REQUESTS[case]
    server = serve(max_items_per_request=8)
    response = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", content=body, headers=headers)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert message in response.json()["error"]
    assert server.runtime.calls == []
    # and the server keeps serving
    ok = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=infer_body(["ok"]))
    assert ok.json()["outputs"][0]["data"] == ["ko"]


def test_body_too_large_is_413(serve):
    server = serve(max_body_bytes=200)
    response = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=infer_body(["a" * 300]))
    assert response.status_code == 413
    assert "exceeds 200" in response.json()["error"]
    bomb = gzip.compress(json.dumps(infer_body(["a" * 30] * 20)).encode())
    response = httpx.post(
        f"{server.url}/v2/models/{MODEL}/infer",
        content=bomb,
        headers={"Content-Encoding": "gzip"},
    )
    assert len(bomb) < 200 and response.status_code == 413


ATTENTION_OUTPUTS = [{"name": "prediction"}, {"name": "attention"}]


def test_a_response_over_max_output_elements_is_413_naming_the_limit(serve):
    # the double's max_output_length is its max_source_length: maps of at most 20 rows
    server = serve(ReverseRuntime(max_source_length=20), max_output_elements=1000)
    url = f"{server.url}/v2/models/{MODEL}/infer"
    big = infer_body(["a" * 20] * 4, outputs=ATTENTION_OUTPUTS)  # 4 x 20 x 21 = 1680 elements
    response = httpx.post(url, json=big)
    assert response.status_code == 413
    error = response.json()["error"]
    assert "could hold up to 1684 output elements (attention maps of 20 x 21)" in error
    assert "max_output_elements=1000" in error
    assert server.metric("skattn_batch_size_sum", model=MODEL) == 0  # refused before decoding
    assert httpx.post(url, json=infer_body(["a" * 20] * 4)).status_code == 200  # 4 elements
    small = infer_body(["a" * 20, "b"], outputs=ATTENTION_OUTPUTS)  # 2 x 20 x 21 + 2
    assert httpx.post(url, json=small).status_code == 200
    assert server.metric("skattn_requests_total", model=MODEL, outcome="too_large") == 1


def test_max_output_elements_bounds_the_maps_before_decoding(serve, fitted_reversal, tmp_path):
    """A request for attention is refused by the most its maps can hold (the model's
    max_output_length rows) before any decoding, so a model that never ends cannot fill the
    memory with maps first. The bound is exact for outputs cut at the limit: here reversals of
    30 digits from a model whose limit is 5 tokens."""
    import copy

    import serving

    model = copy.deepcopy(fitted_reversal).set_params(max_output_length=5)
    runtime = serving.load(model.export_onnx(tmp_path / "m"), device="cpu")
    rng = np.random.default_rng(0)
    sources = ["".join(rng.choice(list("0123456789"), 30)) for _ in range(3)]
    _, maps = runtime.predict_batch(sources, with_attention=True)
    assert [m.shape for m in maps] == [(5, 31)] * 3

    limit = 3 * 5 * 31 + 3 - 1  # one element short of the three maps and predictions
    server = serve(runtime, max_output_elements=limit)
    url = f"{server.url}/v2/models/{MODEL}/infer"
    response = httpx.post(url, json=infer_body(sources, outputs=ATTENTION_OUTPUTS))
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert f"could hold up to {limit + 1} output elements (attention maps of 5 x 31)" in error
    assert server.metric("skattn_batch_size_sum", model=MODEL) == 0  # never decoded
    # attention_lengths alone: 6 elements to answer, but the maps are computed all the same
    lengths_only = infer_body(sources * 2, outputs=[{"name": "attention_lengths"}])
    response = httpx.post(url, json=lengths_only)
    assert response.status_code == 413, response.text
    assert "maps its attention_lengths are read from could hold up to 930" in response.text
    assert server.metric("skattn_batch_size_sum", model=MODEL) == 0  # never decoded
    response = httpx.post(url, json=infer_body(sources[:2], outputs=ATTENTION_OUTPUTS))
    assert response.status_code == 200, response.text
    attention = next(o for o in response.json()["outputs"] if o["name"] == "attention")
    assert attention["shape"] == [2, 5, 31]
    assert server.metric("skattn_batch_size_sum", model=MODEL) == 2


def test_health_answers_while_a_large_response_is_encoded(serve, monkeypatch):
    encoding, finish = threading.Event(), threading.Event()
    encode = protocol.encode_infer_response

    def held_encode(**kwargs):
        encoding.set()
        finish.wait(timeout=10)  # the event loop must not be the thread waiting here
        return encode(**kwargs)

    monkeypatch.setattr(protocol, "encode_infer_response", held_encode)
    server = serve(ReverseRuntime(max_source_length=256))
    request = infer_body(["7" * 256] * 2, outputs=ATTENTION_OUTPUTS)  # 131,586 elements
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, f"{server.url}/v2/models/{MODEL}/infer", json=request)
        assert encoding.wait(timeout=10)
        try:
            started = time.monotonic()
            assert httpx.get(f"{server.url}/v2/health/ready", timeout=3).status_code == 200
            assert time.monotonic() - started < 1.0
        finally:
            finish.set()
        response = answer.result(timeout=20)
    assert response.status_code == 200
    assert response.json()["outputs"][1]["shape"] == [2, 256, 257]


def test_unknown_model_is_404(serve):
    server = serve()
    for response in (
        httpx.post(f"{server.url}/v2/models/nope/infer", json=infer_body(["a"])),
        httpx.get(f"{server.url}/v2/models/nope"),
        httpx.get(f"{server.url}/v2/models/{MODEL}/versions/2"),
        httpx.get(f"{server.url}/v2/nothing/here"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]
    assert server.metric("skattn_requests_total", model="", outcome="not_found") == 1
    wrong_version = f"{server.url}/v2/models/{MODEL}/versions/2/infer"
    assert httpx.post(wrong_version, json=infer_body(["a"])).status_code == 404
    assert server.metric("skattn_requests_total", model=MODEL, outcome="not_found") == 1
    assert server.metric("skattn_requests_total", model="", outcome="not_found") == 1
    assert httpx.get(f"{server.url}/v2/models/{MODEL}/versions/2/ready").status_code == 404
    # the plain paths read no version from their query string
    for path in (f"/v2/models/{MODEL}?version=2", f"/v2/models/{MODEL}/ready?version="):
        assert httpx.get(f"{server.url}{path}").status_code == 200, path


def test_another_method_on_the_infer_path_is_405(serve):
    server = serve()
    for path in (f"/v2/models/{MODEL}/infer", f"/v2/models/{MODEL}/versions/1/infer"):
        response = httpx.get(server.url + path)
        assert response.status_code == 405
        assert response.headers["allow"] == "POST"
        assert response.json()["error"] == "Method Not Allowed"
    ok = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=infer_body(["ok"]))
    assert ok.json()["outputs"][0]["data"] == ["ko"]


def test_a_bug_in_request_handling_answers_500_and_the_server_keeps_serving(serve):
    class BuggyCheck(ReverseRuntime):
        def check_source(self, text):
            if text == "bug":
                raise KeyError("not a ValueError: a bug, not a bad request")
            super().check_source(text)

    server = serve(BuggyCheck())
    url = f"{server.url}/v2/models/{MODEL}/infer"
    response = httpx.post(url, json=infer_body(["bug"]))
    assert response.status_code == 500
    assert response.json() == {"error": "internal error: KeyError"}
    assert httpx.post(url, json=infer_body(["fine"])).json()["outputs"][0]["data"] == ["enif"]
    assert server.metric("skattn_requests_total", model=MODEL, outcome="error") == 1


def test_a_failed_batch_answers_500_to_its_own_requests_only(serve):
    runtime = ReverseRuntime(gated=True)
    server = serve(runtime, max_batch_size=8, max_delay_ms=0)

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            url = f"/v2/models/{MODEL}/infer"
            hold = asyncio.ensure_future(client.post(url, json=infer_body(["hold"])))
            await asyncio.to_thread(runtime.started.acquire)
            # queued together, but their temperatures keep them in separate batches
            bad = asyncio.ensure_future(client.post(url, json=infer_body(["x", "boom"])))
            good = asyncio.ensure_future(
                client.post(url, json=infer_body(["fine"], parameters={"temperature": 2.0}))
            )
            await asyncio.to_thread(wait_until, lambda: server.batcher.queue_depth == 3)
            runtime.release()
            return await hold, await bad, await good

    hold, bad, good = asyncio.run(scenario())
    assert bad.status_code == 500
    assert "injected failure" in bad.json()["error"]
    assert hold.status_code == good.status_code == 200
    assert good.json()["outputs"][0]["data"] == ["enif"]
    assert server.metric("skattn_requests_total", model=MODEL, outcome="error") == 1
    # the batch [x, boom], then its half [boom]: [x] ran apart and succeeded
    assert server.metric("skattn_batch_failures_total", model=MODEL) == 2


def test_a_failing_item_fails_only_its_own_request_within_a_shared_batch(serve):
    runtime = ReverseRuntime(gated=True)
    server = serve(runtime, max_batch_size=64, max_delay_ms=0)

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            url = f"/v2/models/{MODEL}/infer"
            hold = asyncio.ensure_future(client.post(url, json=infer_body(["hold"])))
            await asyncio.to_thread(runtime.started.acquire)
            sources = [f"{i:04d}" for i in range(20)]
            sources.insert(7, "boom")
            posts = [asyncio.ensure_future(client.post(url, json=infer_body([s]))) for s in sources]
            await asyncio.to_thread(wait_until, lambda: server.batcher.queue_depth == 21)
            runtime.release()
            await hold
            return sources, await asyncio.gather(*posts)

    sources, responses = asyncio.run(scenario())
    for source, response in zip(sources, responses, strict=True):
        if source == "boom":
            assert response.status_code == 500
        else:
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"] == [source[::-1]]
    assert runtime.batch_sizes[1] == 21  # they did share one batch
    assert len(runtime.batch_sizes) <= 2 + 2 * 5  # bisection: at most 2 log2(21) more calls


def test_a_model_that_fails_its_warm_up_fails_start_up_with_a_clear_error(keep_logging):
    from serving.process import serve as serve_cli

    class Broken(ReverseRuntime):
        def predict_batch(self, sources, temperature=None, with_attention=False):
            raise IndexError("index 40 is out of bounds for axis 0 with size 32")

    with pytest.raises(SystemExit, match="'broken' failed its warm-up inference.*IndexError"):
        serve_cli({"broken": Broken()}, ServerSettings(), port=0, log_level="critical")

    runtime = ReverseRuntime()
    server = RunningServer(runtime, ServerSettings())
    with server:  # a model that can serve has translated its warm-up source before ready
        assert runtime.warmups == [([WARMUP_SOURCE], None, True)]
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_a_full_queue_answers_503_with_retry_after(serve):
    runtime = ReverseRuntime(gated=True)
    server = serve(runtime, max_batch_size=1, max_delay_ms=0, max_queue=2, max_items_per_request=2)

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            url = f"/v2/models/{MODEL}/infer"
            hold = asyncio.ensure_future(client.post(url, json=infer_body(["hold"])))
            await asyncio.to_thread(runtime.started.acquire)
            queued = asyncio.ensure_future(client.post(url, json=infer_body(["a", "b"])))
            await asyncio.to_thread(wait_until, lambda: server.batcher.queue_depth == 2)
            refused = await client.post(url, json=infer_body(["c"]))
            runtime.release()
            return refused, await hold, await queued

    refused, hold, queued = asyncio.run(scenario())
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert "queue full" in refused.json()["error"]
    assert hold.status_code == queued.status_code == 200
    assert queued.json()["outputs"][0]["data"] == ["a", "b"]
    assert "c" not in runtime.seen


def test_inference_requests_are_answered_in_front_of_fastapi():
    """The guard and the inference route are the app's outermost layers: an inference request
    never enters FastAPI's own middleware (error, telemetry, body limit); the rest do."""
    from serving.guard import RequestGuard
    from serving.infer import InferRoute

    server = RunningServer(ReverseRuntime(), ServerSettings())
    front = server.app.front
    assert isinstance(front, RequestGuard) and isinstance(front.app, InferRoute)
    reached, framework = [], front.app.app

    async def recording(scope, receive, send):
        reached.append((scope["type"], scope.get("path")))
        await framework(scope, receive, send)

    front.app.app = recording
    with server, httpx.Client(base_url=server.url) as client:  # the lifespan reaches FastAPI
        answer = client.post(f"/v2/models/{MODEL}/infer", json=infer_body(["abc"]))
        assert answer.json()["outputs"][0]["data"] == ["cba"]
        assert client.get("/v2/health/ready").status_code == 200
        refused = client.post(f"/v2/models/{MODEL}/infer", content=b"x", headers={
            "content-type": "text/plain"})  # fmt: skip
        assert refused.status_code == 415  # the guard still goes first
    assert [r for r in reached if r[0] == "http"] == [("http", "/v2/health/ready")]
    assert reached[0] == ("lifespan", None)


def test_start_up_objects_leave_the_collectors_generations_while_the_app_runs():
    before = gc.get_freeze_count()
    server = RunningServer(ReverseRuntime(), ServerSettings())
    with server:
        assert gc.get_freeze_count() > before  # frozen once the models were warmed up
        answer = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=infer_body(["ab"]))
        assert answer.json()["outputs"][0]["data"] == ["ba"]
    assert gc.get_freeze_count() == 0  # unfrozen at shutdown: a stopped app can be collected


def test_middleware_added_to_the_app_wraps_inference_requests_too():
    server = RunningServer(ReverseRuntime(), ServerSettings())

    class Tag:
        def __init__(self, app, value):
            self.app, self.value = app, value

        async def __call__(self, scope, receive, send):
            async def tagged(message):
                if message["type"] == "http.response.start":
                    headers = [*message["headers"], (b"x-tag", self.value.encode())]
                    message = {**message, "headers": headers}
                await send(message)

            await self.app(scope, receive, tagged if scope["type"] == "http" else send)

    server.app.add_middleware(Tag, value="outer")
    with server, httpx.Client(base_url=server.url) as client:
        answer = client.post(f"/v2/models/{MODEL}/infer", json=infer_body(["abc"]))
        assert answer.json()["outputs"][0]["data"] == ["cba"]
        assert answer.headers["x-tag"] == "outer"
        assert client.get("/v2/health/live").headers["x-tag"] == "outer"


def test_a_cancelled_request_stays_cancelled_when_its_client_also_leaves():
    """A disconnect and the task's own cancellation at once (a server's shutdown, Ray Serve):
    the cancellation is not swallowed as a client that left."""
    from serving import infer

    class Batcher:
        def withdraw(self, futures):
            for future in futures:
                if not future.done():
                    future.cancel()

    async def scenario():
        future = asyncio.get_running_loop().create_future()
        gone = asyncio.Event()

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        task = asyncio.ensure_future(infer._until_disconnect(Batcher(), [future], receive))
        await asyncio.sleep(0.01)  # waiting for its item
        gone.set()  # the watcher runs first: it withdraws the item
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

        alone = asyncio.ensure_future(
            infer._until_disconnect(
                Batcher(), [asyncio.get_running_loop().create_future()], receive
            )  # fmt: skip
        )
        with pytest.raises(infer._ClientGoneError):  # a disconnect alone: the client left
            await alone

    asyncio.run(scenario())


def test_the_connections_signals_replace_the_watcher_and_the_body_timer(monkeypatch):
    """Under the server's own protocol a request learns that its body has come and that its
    client has gone from ``scope[SIGNALS]``: no timer for a body that has all arrived, no
    watcher task, and its items are withdrawn when the client goes, before or while it waits."""
    from serving import infer
    from serving.signals import RequestSignals

    async def no_timer(awaitable, seconds):
        raise AssertionError("a body that has all arrived was read under a timer")

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def never():
        raise AssertionError("the watcher task ran: the signals should have been used")

    async def scenario():
        signals = RequestSignals()
        signals.body_complete = True
        monkeypatch.setattr(infer, "_within", no_timer)
        assert await infer._read_body(receive, {}, 100, 1.0, signals) == b"{}"

        loop = asyncio.get_running_loop()
        batcher = Batcher()
        futures = [loop.create_future(), loop.create_future()]
        waiting = asyncio.ensure_future(infer._until_disconnect(batcher, futures, never, signals))
        await asyncio.sleep(0)
        signals.disconnect()  # the protocol's connection_lost
        with pytest.raises(infer._ClientGoneError):
            await asyncio.wait_for(waiting, 5)  # (ignored signals would wait for ever)
        assert batcher.withdrawn == [futures] and all(f.cancelled() for f in futures)

        late = [loop.create_future()]  # the client went before its request waited
        with pytest.raises(infer._ClientGoneError):
            await infer._until_disconnect(batcher, late, never, signals)

        answered = RequestSignals()  # answered in time: nothing is left registered
        ready = [loop.create_future()]
        ready[0].set_result("ok")
        assert await infer._until_disconnect(batcher, ready, never, answered) == ["ok"]
        answered.disconnect()
        assert not ready[0].cancelled()

    class Batcher:
        def __init__(self):
            self.withdrawn = []

        def withdraw(self, futures):
            if any(not f.done() for f in futures):
                self.withdrawn.append(futures)
            for future in futures:
                future.cancel()

    asyncio.run(scenario())


def test_a_broken_disconnect_callback_does_not_keep_the_others_from_running(caplog):
    from serving.signals import RequestSignals

    resumed = []
    signals, told = RequestSignals(lambda: resumed.append(True)), []
    signals.on_disconnect(lambda: 1 / 0)
    assert resumed == [True]  # reading resumes, so that the connection sees its client go
    signals.on_disconnect(lambda: told.append("second"))
    unregister = signals.on_disconnect(lambda: told.append("unregistered"))
    unregister()
    signals.disconnect()
    signals.disconnect()  # once only
    assert told == ["second"] and signals.disconnected
    assert "a disconnect callback failed" in caplog.text
    signals.on_disconnect(lambda: told.append("late"))  # registered after: told at once
    assert told == ["second", "late"]


def test_the_server_process_collects_garbage_less_often(monkeypatch):
    import serving.process as entry

    seen = []

    class Server:
        def __init__(self, config):
            self.started = False

        def run(self):
            seen.append(gc.get_threshold())
            self.started = True

    previous = gc.get_threshold()
    monkeypatch.setattr(entry, "_Server", Server)
    entry.serve({MODEL: ReverseRuntime()}, ServerSettings(), port=0)
    assert seen == [entry.GC_THRESHOLDS] and entry.GC_THRESHOLDS[0] > 700
    assert gc.get_threshold() == previous  # restored when serve() returns


def leave_while_queued(serve, http_impl: str, body: bytes, after: bytes = b"", pause=0.0):
    """A gated runtime holds one item; a raw client POSTs ``body`` (its first 10 bytes, then
    ``pause`` seconds later the rest and ``after``), leaves once its item is queued, and the
    server counts it disconnected. Returns the server and its runtime, released."""
    runtime = ReverseRuntime(gated=True)
    server = serve(runtime, http_impl=http_impl, max_batch_size=4, max_delay_ms=0)
    url = f"/v2/models/{MODEL}/infer"
    holder = threading.Thread(target=httpx.post, args=(server.url + url,), kwargs={
        "json": infer_body(["hold"]), "timeout": 20})  # fmt: skip
    holder.start()
    assert runtime.started.acquire(timeout=10)
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.sendall(
            f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        time.sleep(pause)
        raw.sendall(body[10:] + after)
        wait_until(lambda: server.batcher.queue_depth == 1)
    # the connection is closed while "gone" waits in the queue
    wait_until(lambda: server.metric("skattn_requests_total", model=MODEL, outcome="disconnected"))
    runtime.release()
    holder.join(timeout=20)
    return server, runtime


@pytest.mark.parametrize("http_impl", ["httptools", "h11"])
@pytest.mark.parametrize("tail", ["pipelined", "large"])
def test_a_client_that_leaves_is_seen_when_uvicorn_had_stopped_reading(serve, http_impl, tail):
    """uvicorn stops reading a connection while a pipelined request waits, or a request's
    buffered body is over 64 KiB; the request's wait resumes reading (as a watcher waiting on
    receive() did), so the client's going is seen and its queued items withdrawn."""
    body = json.dumps(infer_body(["gone"])).encode()
    after = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    if tail == "large":
        body, after = body + b" " * 100_000, b""  # (JSON's whitespace)
    # (the pause: the handler waits for the rest of its body when it comes)
    _, runtime = leave_while_queued(serve, http_impl, body, after, pause=0.3)
    assert runtime.seen == ["hold"]


@pytest.mark.parametrize("http_impl", ["httptools", "h11"])
def test_a_client_that_disconnects_leaves_no_work_behind(serve, http_impl):
    body = json.dumps(infer_body(["gone"])).encode()
    server, runtime = leave_while_queued(serve, http_impl, body)
    after = httpx.post(server.url + f"/v2/models/{MODEL}/infer", json=infer_body(["after"]))
    assert after.json()["outputs"][0]["data"] == ["retfa"]
    assert runtime.seen == ["hold", "after"]


def test_a_lone_request_does_not_wait_out_the_delay_unless_eager_batching_is_off(serve):
    runtime = ReverseRuntime()
    eager = serve(runtime, max_batch_size=64, max_delay_ms=60_000)
    response = httpx.post(eager.url + f"/v2/models/{MODEL}/infer", json=infer_body(["abc"]))
    assert response.json()["outputs"][0]["data"] == ["cba"]  # at once: httpx would time out

    patient = serve(ReverseRuntime(), max_batch_size=64, max_delay_ms=300, eager_batching=False)
    start = time.monotonic()
    response = httpx.post(patient.url + f"/v2/models/{MODEL}/infer", json=infer_body(["abc"]))
    assert response.json()["outputs"][0]["data"] == ["cba"]
    assert time.monotonic() - start >= 0.3  # waited out the delay for a batch to fill


def test_a_stalled_upload_does_not_slow_a_lone_client_of_an_eager_server(serve):
    server = serve(max_batch_size=64, max_delay_ms=300)
    stalled = socket.create_connection(("127.0.0.1", server.port))
    try:
        stalled.sendall(
            f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
            "Content-Length: 200\r\n\r\n{".encode()
        )
        wait_until(lambda: server.batcher._receiving == 1)
        time.sleep(0.35)  # older than the delay
        with httpx.Client(base_url=server.url) as client:
            latencies = []
            for _ in range(5):
                started = time.monotonic()
                response = client.post(f"/v2/models/{MODEL}/infer", json=infer_body(["abc"]))
                latencies.append(time.monotonic() - started)
                assert response.status_code == 200
        assert sorted(latencies)[2] < 0.15, latencies  # the median is not the 0.3 s delay
    finally:
        stalled.close()


def test_concurrent_requests_share_batches_and_each_gets_its_own_answer(serve):
    runtime = ReverseRuntime(gated=True)
    server = serve(runtime, max_batch_size=64, max_delay_ms=1)
    sources = [f"request {i}" for i in range(40)]

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            url = f"/v2/models/{MODEL}/infer"
            hold = asyncio.ensure_future(client.post(url, json=infer_body(["hold"])))
            await asyncio.to_thread(runtime.started.acquire)
            posts = [asyncio.ensure_future(client.post(url, json=infer_body([s]))) for s in sources]
            await asyncio.to_thread(wait_until, lambda: server.batcher.queue_depth == 40)
            runtime.release()
            await hold
            return await asyncio.gather(*posts)

    responses = asyncio.run(scenario())
    assert [r.json()["outputs"][0]["data"] for r in responses] == [[s[::-1]] for s in sources]
    assert runtime.batch_sizes == [1, 40]
    assert server.metric("skattn_batch_size_count", model=MODEL) == 2
    assert server.metric("skattn_batch_size_sum", model=MODEL) == 41
    assert server.metric("skattn_requests_total", model=MODEL, outcome="ok") == 41
    assert server.metric("skattn_queue_wait_seconds_count", model=MODEL) == 41
    assert server.metric("skattn_inference_seconds_count", model=MODEL) == 2
    assert server.metric("skattn_inference_seconds_sum", model=MODEL) > 0
    assert server.metric("skattn_queue_depth", model=MODEL) == 0


def test_two_instances_serve_a_beam_model_as_its_runtime(serve, fitted_reversal, tmp_path):
    """Two batches at once on one real runtime (onnxruntime sessions shared by two threads):
    every answer is the runtime's own."""
    import copy

    import serving

    model = copy.deepcopy(fitted_reversal).set_params(beam_size=3)  # a search, not a fit, param
    directory = model.export_onnx(tmp_path / "beam")
    runtime = serving.load(directory, device="cpu", intra_op_num_threads=1)
    server = serve(runtime, max_batch_size=4, max_delay_ms=0, instances=2)
    assert server.batcher.instances == 2
    sources = [str(n) for n in range(100, 160)]

    assert one_item_requests_at_once(server, sources) == runtime.predict(sources)
    assert server.metric("skattn_batch_failures_total") == 0
    assert server.metric("skattn_batch_size_sum", model=MODEL) == len(sources)


def test_several_instances_are_refused_for_a_runtime_with_io_binding():
    runtime = ReverseRuntime()
    runtime.io_binding = True  # what serving.load gives on CUDA by default
    with pytest.raises(ValueError, match="instances must be 1 for model 'reverse'"):
        create_app({MODEL: runtime}, ServerSettings(instances=2))
    create_app({MODEL: runtime}, ServerSettings(instances=1))  # one at a time: served


def test_cli_instances_share_the_intra_op_threads(tmp_path, monkeypatch, capsys, keep_logging):
    from serving import layout

    monkeypatch.setattr(layout, "usable_cores", lambda: 9)
    assert layout.default_intra_op_threads() == 8
    assert layout.default_intra_op_threads(2) == 4
    assert layout.default_intra_op_threads(16) == 1
    assert build_parser().parse_args(["--model-dir", "m"]).instances == 1
    assert build_parser().parse_args(["--model-dir", "m", "--instances", "3"]).instances == 3
    with pytest.raises(SystemExit):
        main(["--model-dir", str(tmp_path), "--instances", "0"])
    assert "--instances must be" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model-dir", str(tmp_path), "--instances", "2", "--batching", "continuous"])
    assert "--instances must be 1 with batching='continuous'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Protocol and settings units


@pytest.mark.parametrize("request_id", [None, "r-日本"])
def test_a_small_json_answer_is_one_document_with_the_sliced_encodings_bytes(
    monkeypatch, request_id
):
    """Answers of at most JSON_CHUNK elements a tensor, all JSON, are encoded as one document
    (one encoder call): byte for byte what the slice-at-a-time encoding gives."""
    from serving import responses

    attention, lengths = protocol.attention_tensors(
        [np.float32([[0.25, 0.75], [1.0, 0.0]]), np.float32([[0.5, 0.5, 0.0]])]
    )
    predictions = protocol.prediction_tensor(["a é", ""])
    odd = responses.OutputTensor("attention", "FP32", (1, 3), np.float32([[np.nan, -np.inf, -0.0]]))
    empty = responses.OutputTensor("attention", "FP32", (0, 0, 0), np.zeros((0, 0, 0), np.float32))
    cases = [
        [(predictions, False)],
        [(lengths, False), (predictions, False), (attention, False)],
        [(odd, False)],
        [(empty, False)],
    ]
    for outputs in cases:
        with monkeypatch.context() as patched:  # the one-document path, not the slices
            patched.setattr(responses, "_tensor_json", None)
            small = protocol.encode_infer_response(
                model_name="m", model_version="1", request_id=request_id, outputs=outputs
            )
        with monkeypatch.context() as patched:
            patched.setattr(responses, "JSON_CHUNK", 1)  # every tensor sliced
            sliced = protocol.encode_infer_response(
                model_name="m", model_version="1", request_id=request_id, outputs=outputs
            )
        assert small == sliced
        assert [o["name"] for o in json.loads(small[0])["outputs"]] == [t.name for t, _ in outputs]


@pytest.mark.parametrize("value", [1e300, 3.5e38, 10**400, 0, -1.0, float("nan")])
def test_a_temperature_outside_float32_or_not_positive_is_refused(value):
    with pytest.raises(protocol.ProtocolError, match="temperature must be positive") as error:
        protocol._temperature(value)
    assert error.value.status == 400
    assert len(str(error.value)) < 200  # a huge integer is not echoed
    assert protocol._temperature(3.4e38) == 3.4e38 and protocol._temperature(1e-30) == 1e-30


def test_a_temperature_just_above_float32s_maximum_is_shown_with_every_digit():
    # numpy prints float32's maximum as 3.4028235e+38, just above it: the message must not read
    # "at most 3.403e+38, got 3.4e+38"
    with pytest.raises(protocol.ProtocolError) as error:
        protocol._temperature(3.4028235e38)
    assert "(at most 3.4028234663852886e+38), got 3.4028235e+38" in str(error.value)


def test_one_unicode_rule_for_every_text_json_or_binary(serve):
    server = serve()
    url = f"{server.url}/v2/models/{MODEL}/infer"
    source = '{"inputs": [{"name": "source", "shape": [1], "datatype": "BYTES", "data": [%s]}]}'
    cesu8 = b"\xed\xa0\xbd\xed\xb8\x80"  # U+1F600 as two encoded surrogates
    bad = {
        "json escape": (source % '"\\ud800"').encode(),
        "CESU-8 in JSON": (source % '"@"').encode().replace(b"@", cesu8),
        "id": b'{"id": "\\udc00", ' + (source % '"1"').encode()[1:],
        "binary CESU-8": None,
    }
    for case, body in bad.items():
        if body is None:
            body, headers = binary_request(element(cesu8))
        else:
            headers = {}
        response = httpx.post(url, content=body, headers=headers)
        assert response.status_code == 400, case
        assert "Unicode" in response.json()["error"] or "UTF-8" in response.json()["error"]
    pair = (source % '"\\ud83d\\ude00"').encode()  # a valid surrogate pair is one character
    response = httpx.post(url, content=pair)
    assert response.status_code == 200 and response.json()["outputs"][0]["data"] == ["\U0001f600"]
    assert server.runtime.seen == ["\U0001f600"]


def test_an_empty_outputs_list_answers_the_prediction(serve):
    server = serve()
    for binary in (False, True):
        body = infer_body(["ab"], outputs=[], parameters={"binary_data_output": binary})
        response = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=body)
        assert response.status_code == 200
        header = response.content
        if binary:
            length = int(response.headers["inference-header-content-length"])
            header = response.content[:length]
        outputs = json.loads(header)["outputs"]
        assert [output["name"] for output in outputs] == ["prediction"]


def test_a_path_with_a_trailing_slash_is_a_json_404_not_a_redirect(serve):
    server = serve()
    for path in (f"/v2/models/{MODEL}/", "/v2/health/ready/", f"/v2/models/{MODEL}/infer/"):
        response = httpx.get(server.url + path)
        assert response.status_code == 404, path
        assert response.json()["error"]


def test_no_openapi_schema_or_docs_are_served(serve):
    server = serve()
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert httpx.get(server.url + path).status_code == 404


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_delay_ms": -0.5}, "max_delay_ms"),
        ({"max_delay_ms": 1e308}, "max_delay_ms"),  # every short batch would wait "forever"
        ({"body_timeout_s": 3601}, "body_timeout_s"),
        ({"max_queue": 1.5}, "max_queue"),
        ({"max_items_per_request": 0}, "max_items_per_request"),
        ({"max_body_bytes": True}, "max_body_bytes"),
        ({"max_queue": 4, "max_items_per_request": 8}, "max_items_per_request"),
        ({"eager_batching": 1}, "eager_batching"),
        ({"instances": 0}, "instances"),
        ({"instances": 65}, "instances"),
        ({"instances": 2, "batching": "continuous"}, "instances must be 1"),
    ],
)
def test_server_settings_are_validated(settings, name):
    with pytest.raises(ValueError, match=name):
        ServerSettings(**settings)


def test_create_app_refuses_no_models():
    with pytest.raises(ValueError, match="runtimes"):
        create_app({})


def test_create_app_takes_only_runtimes_of_the_shared_protocol():
    from serving.interface import Runtime

    assert isinstance(ReverseRuntime(), Runtime)

    class NoInfo:  # what the server used to duck-type: no info record
        max_source_length, provider = 8, "CPUExecutionProvider"

        def check_source(self, text):
            pass

        def predict_batch(self, sources, temperature=None, with_attention=False):
            return list(sources), None

    with pytest.raises(ValueError, match="serving.interface.Runtime"):
        create_app({MODEL: NoInfo()})


def test_json_log_lines_carry_extra_fields():
    record = logging.makeLogRecord(
        {"name": "serving.app", "levelname": "INFO", "msg": "infer %s", "args": ("x",)}
    )
    record.model, record.items = MODEL, 3
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "infer x" and line["level"] == "info"
    assert line["model"] == MODEL and line["items"] == 3
    assert line["time"].endswith("Z")


# ---------------------------------------------------------------------------------------------
# The process: python -m serving, SIGTERM, import hygiene


def test_serving_never_imports_torch_or_sklearn():
    code = (
        "import sys, serving, serving.app, serving.batcher, serving.protocol, serving.metrics, "
        "serving.__main__, serving.process\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'sklearn') or m in "
        "('skattn.estimator', 'skattn.models', 'skattn.attention')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_cli_defaults_follow_the_design_and_bind_localhost():
    args = build_parser().parse_args(["--model-dir", "m"])
    assert (args.host, args.port, args.device) == ("127.0.0.1", 8000, "auto")
    assert (args.max_batch_size, args.max_delay_ms, args.max_queue) == (64, 2.0, 1024)
    assert args.eager_batching is True
    assert not build_parser().parse_args(["--model-dir", "m", "--no-eager-batching"]).eager_batching
    assert args.batching == "dynamic"
    continuous = ["--model-dir", "m", "--batching", "continuous"]
    assert build_parser().parse_args(continuous).batching == "continuous"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model-dir", "m", "--batching", "iteration"])
    assert build_parser().parse_args(["--model-dir", "m", "--device", "cuda:1"]).device == "cuda:1"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model-dir", "m", "--device", "tpu"])


def test_every_server_setting_has_its_flag():
    args = vars(build_parser().parse_args(["--model-dir", "m", "--retry-after-s", "3"]))
    fields = set(ServerSettings.__dataclass_fields__) - {"allowed_hosts"}  # --allowed-host
    assert fields <= set(args) and "allowed_host" in args
    assert args["retry_after_s"] == 3


def test_cli_model_dir_repeats_as_name_equals_dir(tmp_path, capsys, keep_logging):
    args = build_parser().parse_args(["--model-dir", "a=x/m1", "--model-dir", "y/m2"])
    assert args.model_dir == [("a", Path("x/m1")), (None, Path("y/m2"))]
    odd = tmp_path / "with=sign"
    odd.mkdir()  # an existing directory whose name holds "=" stays a directory
    assert build_parser().parse_args(["--model-dir", str(odd)]).model_dir == [(None, odd)]
    with pytest.raises(SystemExit):
        main(["--model-dir", "a=x", "--model-dir", "b=y", "--model-name", "c"])
    assert "--model-name names a single --model-dir" in capsys.readouterr().err
    # a name the server could not route is refused before any model loads (x does not exist)
    with pytest.raises(SystemExit) as bad_name:
        main(["--model-dir", "x", "--model-name", "a/b"])
    assert bad_name.value.code == 2
    assert "'a/b' must be non-empty, hold no '/'" in capsys.readouterr().err
    for dots in (".", ".."):  # a client collapses v2/models/../infer into v2/infer
        with pytest.raises(SystemExit):
            main(["--model-dir", "x", "--model-name", dots])
        assert f"model name {dots!r} must be non-empty, hold no '/' and not be" in (
            capsys.readouterr().err
        )
    with pytest.raises(SystemExit):
        main(["--model-dir", "x", "--model-name", ""])
    assert "model name '' must be non-empty" in capsys.readouterr().err
    for flag in (
        "--max-delay-ms",
        "--shutdown-timeout",
        "--body-timeout-s",
        "--keep-alive-s",
        "--linger-s",
    ):
        with pytest.raises(SystemExit):
            main(["--model-dir", "x", flag, "1e308"])
        assert flag.lstrip("-").replace("-", "_") in capsys.readouterr().err.replace("-", "_")


def test_cli_fails_fast_on_a_bad_model_dir(tmp_path, capsys, keep_logging):
    assert main(["--model-dir", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["--model-dir", str(tmp_path)]) == 2  # no manifest, no graphs
    assert "cannot load the model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad_flag:
        main(["--model-dir", str(tmp_path), "--max-batch-size", "0"])
    assert bad_flag.value.code == 2
    assert "--max-batch-size must be" in capsys.readouterr().err  # the flag, not the field
    # a small queue lowers the per-request default to fit, so it is no error
    assert main(["--model-dir", str(tmp_path), "--max-queue", "8"]) == 2
    assert "cannot load the model" in capsys.readouterr().err


def test_cli_refuses_an_empty_host_or_dir_and_a_file_limit_without_room(
    tmp_path, capsys, monkeypatch, keep_logging
):
    """An empty --host bound every interface with the Host check off; NAME= served the working
    directory; a file-descriptor limit without room for a connection ended in a traceback,
    after the models had loaded."""
    import resource

    for argv, words in (
        (["--model-dir", str(tmp_path), "--host", ""], "--host: an empty address"),
        (["--model-dir", str(tmp_path), "--host", "  "], "--host: an empty address"),
        (["--model-dir", "x="], "names no directory after the '='"),
        (["--model-dir", ""], "an empty DIR"),
    ):
        with pytest.raises(SystemExit) as refused:
            main(argv)
        assert refused.value.code == 2
        assert words in capsys.readouterr().err
    monkeypatch.setattr(resource, "getrlimit", lambda which: (60, 60))
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: None)
    with pytest.raises(SystemExit) as refused:
        main(["--model-dir", str(tmp_path / "never-read")])
    assert refused.value.code == 2
    assert "the file-descriptor limit (60) leaves no room" in capsys.readouterr().err


def test_a_server_that_cannot_bind_says_so(keep_logging):
    """uvicorn's exit on an address in use went out as it was (status 3), past the line that
    says the server could not start."""
    import socket

    from serving.process import serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runtime = ReverseRuntime()
        with pytest.raises(
            SystemExit, match=rf"could not start: could not listen on 127.0.0.1:{port}"
        ):
            serve({"m": runtime}, ServerSettings(), port=port, log_level="critical")


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from serving_doubles import ReverseRuntime
    from serving.process import configure_logging, serve
    from serving.app import ServerSettings

    configure_logging("debug")
    serve(
        {{"reverse": ReverseRuntime(delay={delay})}},
        ServerSettings({settings}),
        port={port},
        shutdown_timeout={shutdown_timeout},
    )
    print("returned", flush=True)
    """
)

#: The request's batch has started (its one-second inference is under way).
BATCH_STARTED = 'skattn_queue_wait_seconds_count{model="reverse"} 1.0'
#: The request waits in the queue (a minute's batching delay, not eager).
QUEUED = 'skattn_queue_depth{model="reverse"} 1.0'


@pytest.mark.parametrize(
    ("settings", "delay", "shutdown_timeout", "signalled_when"),
    [
        ("", 1.0, 30.0, BATCH_STARTED),
        # queued items run as shutdown begins: a delay outlasting its timeout answered 503
        ("eager_batching=False, max_delay_ms=60_000", 0.0, 10.0, QUEUED),
    ],
)
def test_sigterm_finishes_in_flight_requests_then_exits_0(
    tmp_path, settings, delay, shutdown_timeout, signalled_when
):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = tmp_path / "serve.py"
    script.write_text(
        SIGTERM_SCRIPT.format(
            tests=str(REPO / "tests"),
            port=port,
            settings=settings,
            delay=delay,
            shutdown_timeout=shutdown_timeout,
        )
    )
    process = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready():
            try:
                return httpx.get(f"{url}/v2/health/ready").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout=30)
        answers = []
        client = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{url}/v2/models/reverse/infer", json=infer_body(["slow"]), timeout=30)
            )
        )
        client.start()
        wait_until(lambda: signalled_when in httpx.get(f"{url}/metrics").text)
        process.send_signal(signal.SIGTERM)
        client.join(timeout=30)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert answers and answers[0].status_code == 200
    assert answers[0].json()["outputs"][0]["data"] == ["wols"]
    assert "returned" in stdout
    logs = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert any(entry["message"] == "draining" for entry in logs)
    assert any(entry.get("outcome") == "ok" and entry.get("model") == "reverse" for entry in logs)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/v2/health/live")


# ---------------------------------------------------------------------------------------------
# A real exported model: the server's answers equal serving.load(...).predict


@pytest.fixture(scope="module")
def artifact(fitted_reversal, tmp_path_factory):
    """The conftest's fitted reversal model, exported once for this module."""
    directory = tmp_path_factory.mktemp("served") / "reversal"
    fitted_reversal.export_onnx(directory)
    return directory


class HeldRuntime:
    """A real runtime whose batches wait at a gate, so that a test can pile up a queue."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.started = threading.Semaphore(0)
        self.batch_sizes = []
        self.warmed_up = False
        self._gate = threading.Event()

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def release(self):
        self._gate.set()

    def predict_batch(self, sources, temperature=None, with_attention=False):
        if not self.warmed_up:  # the server's warm-up call, before it is ready: never held
            self.warmed_up = True
            return self.runtime.predict_batch(sources, temperature, with_attention)
        self.batch_sizes.append(len(sources))
        self.started.release()
        if not self._gate.wait(timeout=30):
            raise RuntimeError("test gate never released")
        return self.runtime.predict_batch(sources, temperature, with_attention)


def test_batched_answers_equal_unbatched_ones(artifact, reversal_data, serve):
    import serving

    reference = serving.load(artifact, device="cpu")
    held = HeldRuntime(serving.load(artifact, device="cpu"))
    server = serve(held, max_batch_size=64, max_delay_ms=1)
    _, _, X_test, _ = reversal_data
    sources = [*X_test[:20], "", X_test[0][:1]]
    temperatures = [None, 0.5] * (len(sources) // 2)

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            url = f"/v2/models/{MODEL}/infer"
            hold = asyncio.ensure_future(client.post(url, json=infer_body(["1"])))
            await asyncio.to_thread(held.started.acquire)
            posts = []
            for source, temperature in zip(sources, temperatures, strict=True):
                params = {} if temperature is None else {"temperature": temperature}
                body = infer_body(
                    [source],
                    parameters=params,
                    outputs=[{"name": n} for n in protocol.OUTPUT_NAMES],
                )
                posts.append(asyncio.ensure_future(client.post(url, json=body)))
            await asyncio.to_thread(wait_until, lambda: server.batcher.queue_depth == len(posts))
            held.release()
            await hold
            return await asyncio.gather(*posts)

    responses = asyncio.run(scenario())
    assert held.batch_sizes == [1, len(sources) // 2, len(sources) // 2]  # one per temperature
    for source, temperature, response in zip(sources, temperatures, responses, strict=True):
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        [prediction] = reference.predict([source], temperature)
        [attention] = reference.predict_attention([source], temperature)
        assert outputs["prediction"]["data"] == [prediction]
        assert outputs["attention_lengths"]["data"] == list(attention.shape)
        served = np.array(outputs["attention"]["data"], dtype=np.float32).reshape(attention.shape)
        np.testing.assert_allclose(served, attention, atol=1e-5)


@pytest.mark.slow
def test_soak_64_concurrent_clients_get_every_answer_right(artifact, reversal_data, serve):
    import serving

    reference = serving.load(artifact, device="cpu")
    server = serve(serving.load(artifact, device="cpu"), max_batch_size=32, max_delay_ms=2)
    _, _, X_test, _ = reversal_data
    pool = [*X_test, "", "9" * min(reference.max_source_length, 40)]
    expected = {s: reference.predict([s])[0] for s in pool}  # one source per call: unbatched
    n_clients, n_requests = 64, 4

    async def client(index, http):
        answers = []
        for k in range(n_requests):
            start = (index * n_requests + k) * 3
            sources = [pool[(start + j) % len(pool)] for j in range(1 + (index + k) % 3)]
            response = await http.post(f"/v2/models/{MODEL}/infer", json=infer_body(sources))
            answers.append((sources, response.status_code, response.json()))
        return answers

    async def scenario():
        ssl_context = ssl.create_default_context()  # one for all: making one costs ~10 ms
        clients = [
            httpx.AsyncClient(base_url=server.url, timeout=60, verify=ssl_context)
            for _ in range(n_clients)
        ]
        try:
            return await asyncio.wait_for(
                asyncio.gather(*(client(i, http) for i, http in enumerate(clients))), timeout=120
            )
        finally:
            for http in clients:
                await http.aclose()

    results = [answer for answers in asyncio.run(scenario()) for answer in answers]
    assert len(results) == n_clients * n_requests
    for sources, status, body in results:
        assert status == 200, body
        assert body["outputs"][0]["data"] == [expected[s] for s in sources]
    n_items = sum(len(sources) for sources, _, _ in results)
    assert server.metric("skattn_requests_total", model=MODEL, outcome="ok") == len(results)
    assert server.metric("skattn_batch_size_sum", model=MODEL) == n_items  # nothing lost
    assert server.metric("skattn_batch_size_count", model=MODEL) < n_items  # batches formed
    assert server.metric("skattn_queue_depth", model=MODEL) == 0


@pytest.mark.slow
def test_cli_serves_several_models_under_their_names(artifact, capsys, keep_logging):
    with pytest.raises(SystemExit):  # two models may not share a name
        main(["--model-dir", str(artifact), "--model-dir", str(artifact), "--device", "cpu"])
    assert "two models are named" in capsys.readouterr().err
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "serving", "--model-dir", f"first={artifact}",
         "--model-dir", f"second={artifact}", "--port", str(port), "--device", "cpu"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def ready():
            try:
                return httpx.get(f"{base}/v2/health/ready", timeout=2).status_code == 200
            except httpx.HTTPError:  # not listening yet
                return False

        wait_until(ready, timeout=60)
        listing = httpx.get(f"{base}/v2/models", timeout=5).json()
        page = httpx.get(f"{base}/", timeout=5)
        answers = [
            httpx.post(
                f"{base}/v2/models/{name}/infer",
                json={"inputs": [{"name": "source", "shape": [1], "datatype": "BYTES",
                                  "data": ["123"]}]},
                timeout=30,
            ).json()["outputs"][0]["data"]
            for name in ("first", "second")
        ]  # fmt: skip
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert [m["name"] for m in listing] == ["first", "second"]
    assert all(m["ready"] for m in listing)
    assert page.status_code == 200 and "Attention explorer" in page.text
    assert answers[0] == answers[1]
    assert process.returncode == 0, stderr


@pytest.mark.slow
def test_cli_serves_an_exported_model_to_tritonclient(artifact, tmp_path):
    import serving

    expected = serving.load(artifact, device="cpu").predict(["123", "98765"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "serving", "--model-dir", str(artifact), "--port", str(port),
         "--model-name", "rev", "--device", "cpu", "--max-delay-ms", "1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        client = triton.InferenceServerClient(url=f"127.0.0.1:{port}", network_timeout=30)

        def ready():
            try:
                return client.is_model_ready("rev")
            except Exception:  # not listening yet
                return False

        wait_until(ready, timeout=60)
        result = client.infer("rev", [source_input(["123", "98765"])])
        meta = client.get_model_metadata("rev")
        client.close()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert [p.decode() for p in result.as_numpy("prediction")] == expected
    assert meta["parameters"]["provider"] == "CPUExecutionProvider"
    assert process.returncode == 0, stderr


def test_a_request_cancelled_by_the_shutdown_gets_a_json_503():
    """uvicorn cancels the requests still running when --shutdown-timeout runs out; the client
    gets a JSON 503 with Retry-After, not uvicorn's plain-text 500."""
    from types import SimpleNamespace

    from serving.infer import InferRoute

    started = asyncio.Event()

    class Waiting:  # a handler waiting on a batch that never ends
        settings = SimpleNamespace(retry_after_s=2)

        async def __call__(self, scope, receive, name, version):
            started.set()
            await asyncio.Event().wait()

    async def body():
        sent = []

        async def send(message):
            sent.append(message)

        route = InferRoute(app=None, handler=Waiting())
        scope = {"type": "http", "path": f"/v2/models/{MODEL}/infer", "method": "POST"}
        task = asyncio.ensure_future(route(scope, None, send))
        await started.wait()
        task.cancel()  # what uvicorn does once the graceful shutdown times out
        await task
        return sent

    start, end = asyncio.run(body())
    assert start["status"] == 503
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json" and headers[b"retry-after"] == b"2"
    assert "shutting down" in json.loads(end["body"])["error"]


def test_lengths_of_thousands_of_digits_are_refused_not_crashed_on(serve):
    # int() refuses more than 4,300 digits: a ValueError that was answered 500 before
    server = serve()
    body = json.dumps(infer_body(["abc"])).encode()
    huge = "9" * 5000
    response = httpx.post(
        f"{server.url}/v2/models/{MODEL}/infer",
        content=body,
        headers={"Content-Type": "application/octet-stream", protocol.HEADER_LENGTH: huge},
    )
    assert response.status_code == 400
    assert "9999999999... (5000 digits)" in response.json()["error"]
    padded = "0" * 4990 + str(len(body))  # the HTTP parser reads it as the real length
    request = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {padded}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert server.metric("skattn_requests_total", model=MODEL, outcome="error") == 0

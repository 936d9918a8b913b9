"""The server on Ray Serve: 2 replicas on a local Ray instance (127.0.0.1), concurrent clients,
tritonclient, health, and the builder's arguments."""

from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

import serving

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
triton = pytest.importorskip("tritonclient.http")

from serving.ray_deployment import REPLICA_HEADER, build  # noqa: E402

MODEL = "reverse"
SOURCES = [str(n) * (1 + n % 5) for n in range(40)] + ["", "héllo", "9876543210"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, fitted_reversal):
    return fitted_reversal.export_onnx(tmp_path_factory.mktemp("ray") / MODEL)


@pytest.fixture(scope="module")
def ray_app(artifact):
    """The URLs of a Ray Serve app with 2 replicas of the server: Ray's ingress, and the port
    the replicas share (``SO_REUSEPORT``)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # 2 CPUs for the 2 replicas, and a third for the autoscaling test's (0.1 CPU each)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    port = _free_port()
    shared = next(p for p in iter(_free_port, None) if p != port)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    args = {"model_dir": str(artifact), "model_name": MODEL, "num_replicas": "2"}
    shared_args = {"shared_port": str(shared), "max_connections": "256"}  # limits ride along
    serve.run(build({**args, **shared_args}), name="skattn", route_prefix="/")
    yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{shared}"
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def replicas(ray_app):
    """``http://127.0.0.1:PORT``: Ray's ingress to the 2 replicas."""
    return ray_app[0]


@pytest.fixture(scope="module", params=["ingress", "shared port"])
def either_way(request, ray_app):
    """Ray's ingress, then the port the replicas listen on themselves."""
    return ray_app[request.param == "shared port"]


def _infer(client: httpx.Client, sources: list[str]) -> tuple[list[str], str]:
    body = {"inputs": [{"name": "source", "datatype": "BYTES", "shape": [len(sources)]}]}
    body["inputs"][0]["data"] = sources
    response = client.post(f"/v2/models/{MODEL}/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    (output,) = [o for o in response.json()["outputs"] if o["name"] == "prediction"]
    return output["data"], response.headers[REPLICA_HEADER]


@pytest.mark.slow
def test_two_replicas_answer_concurrent_clients_as_the_runtime_does(either_way, artifact):
    expected = serving.load(artifact, device="cpu").predict(SOURCES)
    requests = [SOURCES[i : i + 1 + i % 3] for i in range(len(SOURCES))] * 3
    starts = [SOURCES.index(r[0]) for r in requests]
    # a connection per request: on the shared port the kernel picks a replica per connection
    fresh = httpx.Limits(max_keepalive_connections=0)
    with (
        httpx.Client(base_url=either_way, limits=fresh) as client,
        ThreadPoolExecutor(16) as pool,
    ):
        answers = list(pool.map(lambda r: _infer(client, r), requests))
    for start, request, (predictions, _) in zip(starts, requests, answers, strict=True):
        assert predictions == expected[start : start + len(request)]
    assert len({replica for _, replica in answers}) == 2  # both replicas served


@pytest.mark.slow
def test_tritonclient_works_against_ray_serve_unmodified(either_way, artifact):
    client = triton.InferenceServerClient(either_way.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(MODEL)
        assert client.get_model_metadata(MODEL)["name"] == MODEL
        source = triton.InferInput("source", [3], "BYTES")
        source.set_data_from_numpy(np.array([b"123", b"4567", b""], dtype=np.object_))
        result = client.infer(MODEL, [source])
    finally:
        client.close()
    predictions = [p.decode() for p in result.as_numpy("prediction")]
    assert predictions == serving.load(artifact, device="cpu").predict(["123", "4567", ""])


@pytest.mark.slow
def test_health_and_readiness_come_from_a_running_replica(either_way):
    # Ray's router may send one client's requests, one at a time, to the same idle replica,
    # so the probes go 8 at a time until both replicas have answered (at most 40 rounds).
    seen = set()
    paths = ("/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready")

    def probe(path):
        response = httpx.get(f"{either_way}{path}", timeout=30)
        assert response.status_code == 200, (path, response.text)
        return response.headers[REPLICA_HEADER]

    with ThreadPoolExecutor(8) as pool:
        for round_ in range(40):
            seen.update(pool.map(probe, [paths[(round_ + i) % 3] for i in range(8)]))
            if len(seen) == 2:
                break
    assert len(seen) == 2
    status = serve.status().applications["skattn"]
    assert status.status == "RUNNING"
    (deployment,) = status.deployments.values()
    assert deployment.replica_states == {"RUNNING": 2}


def _running(app: str) -> int:
    (deployment,) = serve.status().applications[app].deployments.values()
    return deployment.replica_states.get("RUNNING", 0)


#: Ray 2.60 warns that metrics_interval_s will move to environment variables; it reads it still.
RAY_DEPRECATES_INTERVAL = "ignore:The `metrics_interval_s` field:DeprecationWarning"


@pytest.mark.slow
@pytest.mark.filterwarnings(RAY_DEPRECATES_INTERVAL)
def test_replicas_autoscale_on_the_load_of_their_shared_port_alone(ray_app, artifact):
    """Up to 2 replicas while 24 clients post to the shared port only (Ray's ingress idle), and
    back to 1 after; every answer right."""
    import threading
    import time

    port = next(p for p in iter(_free_port, None) if f":{p}" not in "".join(ray_app))
    args = {
        "model_dir": str(artifact), "model_name": MODEL, "shared_port": port, "num_cpus": 0.1,
        "max_replicas": 2, "target_ongoing_requests": 2, "metrics_interval_s": 0.25,
        "look_back_period_s": 1, "upscale_delay_s": 0.5, "downscale_delay_s": 1,
    }  # fmt: skip
    serve.run(build(args), name="scaled", route_prefix="/scaled")
    try:
        assert _running("scaled") == 1
        expected = serving.load(artifact, device="cpu").predict(SOURCES)
        answers, scaled = [], threading.Event()

        def post_until_scaled(index):
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                while not scaled.is_set():
                    answers.append((index, _infer(client, SOURCES[index : index + 1])[0]))

        with ThreadPoolExecutor(25) as pool:
            load = [pool.submit(post_until_scaled, i) for i in range(24)]
            for _ in range(240):  # Ray's status, read by one thread (4 a second at most)
                if _running("scaled") == 2 or any(f.done() for f in load):
                    break
                time.sleep(0.25)
            scaled.set()
            for future in load:
                future.result()  # (a client's error)
        assert _running("scaled") == 2, "no second replica within 60 s of load"
        assert all(predictions == expected[i : i + 1] for i, predictions in answers)
        for _ in range(120):
            if _running("scaled") == 1:
                break
            time.sleep(0.25)
        assert _running("scaled") == 1, "still 2 replicas 30 s after the load"
    finally:
        serve.delete("scaled")


#: For the tests of build's settings with made-up folders: read by the replicas only.
UNREAD = {"check_model_dir": "false"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "model_dir"),
        ({"model_dir": "a,b", "model_name": "x"}, "model_name"),
        ({"model_dir": "a", "num_replicas": "two"}, "num_replicas"),
        ({"model_dir": "a", "max_delay_ms": "-1"}, "max_delay_ms"),
        ({"model_dir": "a", "eager_batching": "maybe"}, "eager_batching"),
        ({"model_dir": "a", "log_level": "loud"}, "log_level"),
        ({"model_dir": "a", "access_log": "sometimes"}, "access_log"),
        ({"model_dir": "/x/art,/y/art"}, "two models are named 'art'"),
        ({"model_dir": "a", "model_name": ".."}, "model_name"),
        ({"model_dir": "a", "num_cpus": "inf"}, "num_cpus"),
        ({"model_dir": "a", "num_cpus": "nan"}, "num_cpus"),
        ({"model_dir": "a", "instances": "0"}, "instances"),
        # dropped without a word before: a misspelled setting, autoscaling settings without
        # max_replicas, num_replicas beside it
        ({"model_dir": "a", "max_batch_sizee": "8"}, "unknown argument 'max_batch_sizee'"),
        ({"model_dir": "a", "intra_op_threads": "4"}, "unknown argument 'intra_op_threads'"),
        ({"model_dir": "a", "min_replicas": "2"}, "min_replicas is an autoscaling setting"),
        ({"model_dir": "a", "num_replicas": "3", "max_replicas": "4"}, "not both"),
        ({"model_dir": "a", "device": "cuda"}, "device=cuda needs num_gpus"),
        ({"model_dir": "a", "device": "tpu"}, "device must be"),
        ({"model_dir": "a", "num_gpus": "-1"}, "num_gpus"),
        ({"model_dir": "a", "shared_port": "http"}, "shared_port must be an int"),
        ({"model_dir": "a", "shared_port": "0"}, "shared_port must be a TCP port"),
        ({"model_dir": "a", "shared_port": "65536"}, "shared_port must be a TCP port"),
        ({"model_dir": "a", "shared_host": "0.0.0.0"}, "give shared_port too"),
        ({"model_dir": "a", "shared_port": "8100", "shared_host": ""}, "shared_host"),
        ({"model_dir": "a", "shared_port": "8100", "shared_host": "localhost"}, "IP address"),
        ({"model_dir": "a", "shared_close_grace_s": "1"}, "give shared_port too"),
        ({"model_dir": "a", "shared_port": "8100", "shared_close_grace_s": "6"}, "0 to 5"),
        (
            {"model_dir": "a", "shared_port": "8100", "max_replicas": "2", "min_replicas": "0"},
            "min_replicas must be >= 1 with shared_port",
        ),
        ({"model_dir": "a", "max_replicas": "2", "metrics_interval_s": "30"}, "longer than"),
        ({"model_dir": "a", "upscale_delay_s": "1"}, "upscale_delay_s is an autoscaling"),
        ({"model_dir": "a", "max_replicas": "2", "min_replicas": "3"}, "min_replicas <= max"),
        ({"model_dir": "a", "max_replicas": "0"}, "max_replicas >= 1"),
        ({"model_dir": "a", "max_replicas": "2", "target_ongoing_requests": "0"}, "target_ong"),
        ({"model_dir": "a", "max_replicas": "2", "downscale_delay_s": "-1"}, "downscale_delay_s"),
        ({"model_dir": "a", "max_replicas": "2", "metrics_interval_s": "0"}, "metrics_interval_s"),
        ({"model_dir": "a", "max_replicas": "2", "look_back_period_s": "inf"}, "look_back_period"),
        ({"model_dir": "a", "max_replicas": "2", "look_back_period_s": "5"}, "longer than metr"),
        ({"model_dir": "a", "max_connections": "8"}, "max_connections limits the shared port"),
        ({"model_dir": "a", "shared_port": "8100", "max_connections": "0"}, "max_connections"),
        ({"model_dir": "a", "shared_port": "8100", "keep_alive_s": "-1"}, "keep_alive_s"),
        ({"model_dir": "a", "shared_port": "8100", "header_timeout_s": "soon"}, "header_timeout_s"),
        ({"model_dir": "a", "shared_port": "1", "max_connection_age_s": "0"}, "max_connection_age"),
        ({"model_dir": "a", "shared_port": "1", "max_connection_age_s": "old"}, "max_connection_a"),
        ({"model_dir": "a", "shared_port": "1", "max_connection_age_s": "1e6"}, "max_connection_a"),
        ({"model_dir": "a", "shared_port": "1", "linger_s": "-1"}, "linger_s"),
        ({"model_dir": "a", "linger_s": "5"}, "linger_s limits the shared port"),
    ],
)
def test_bad_builder_arguments_raise_value_error_naming_them(args, message):
    with pytest.raises(ValueError, match=message):
        build(args)


@pytest.mark.parametrize(
    ("args", "message"),
    [  # from Python: int(1.7) was 1 replica, int(True) 1, bool(2) True
        ({"num_replicas": 1.7}, "num_replicas must be an int, got 1.7"),
        ({"num_replicas": True}, "num_replicas must be an int, got True"),
        ({"max_batch_size": 64.9}, "max_batch_size must be an int"),
        ({"eager_batching": 2}, "eager_batching must be true or false"),
        ({"num_cpus": True}, "num_cpus must be a number"),
    ],
)
def test_builder_values_from_python_are_taken_only_of_their_kind(args, message):
    with pytest.raises(ValueError, match=message):
        build({**UNREAD, "model_dir": "/m/reverse", **args})
    assert build({**UNREAD, "model_dir": "/m/reverse", "num_replicas": 2, "num_cpus": 1})
    logging = build({**UNREAD, "model_dir": "/m/reverse", "access_log": 1, "eager_batching": 0})
    assert logging._bound_deployment.logging_config["enable_access_log"] is True  # (YAML's 1)


def test_a_model_dir_build_cannot_read_is_refused_there(artifact, tmp_path):
    """A missing folder deployed, then every replica failed to start (serve run exited 0)."""
    with pytest.raises(ValueError, match=r"model_dir: .*not an artifact directory"):
        build({"model_dir": str(tmp_path / "nowhere")})
    assert build({"model_dir": str(artifact)})  # read and found whole
    assert build({**UNREAD, "model_dir": str(tmp_path / "nowhere")})  # the replicas' own


def test_a_small_max_queue_lowers_the_items_a_request_may_hold_as_the_cli_does():
    replica = build({**UNREAD, "model_dir": "/m/reverse", "max_queue": "100"})._bound_deployment
    assert "max_items_per_request': 100" in str(replica.init_args)


def test_builder_sets_replicas_or_autoscaling():
    fixed = build({**UNREAD, "model_dir": "/m/reverse", "num_replicas": "3", "num_cpus": "2"})
    assert fixed._bound_deployment.num_replicas == 3
    assert fixed._bound_deployment.ray_actor_options["num_cpus"] == 2.0
    scaled = build({**UNREAD, "model_dir": "/m/reverse", "min_replicas": "1", "max_replicas": "4"})
    config = scaled._bound_deployment._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas) == (1, 4)


@pytest.mark.filterwarnings(RAY_DEPRECATES_INTERVAL)
def test_autoscaling_a_shared_port_counts_its_requests_with_rays():
    """Ray's autoscaler saw only the requests its ingress routes: a deployment loaded on the
    shared port alone stayed at min_replicas (so build refused the two together)."""
    from ray.serve.config import AutoscalingContext

    from serving.ray_autoscaling import POLICY, SHARED_PORT_ONGOING, shared_port_policy

    def config(**args):
        app = build({**UNREAD, "model_dir": "/m/reverse", "max_replicas": "4", **args})
        return app._bound_deployment._deployment_config.autoscaling_config

    timing = {"upscale_delay_s": "0", "downscale_delay_s": "2.5", "metrics_interval_s": "0.5"}
    shared = config(shared_port="8100", target_ongoing_requests="8", **timing)
    assert shared.policy.policy_function == POLICY  # Ray's policy counts the shared port too
    assert (shared.upscale_delay_s, shared.downscale_delay_s) == (0.0, 2.5)
    assert (shared.metrics_interval_s, shared.look_back_period_s) == (0.5, 30.0)  # Ray's default
    assert config().policy.is_default_policy_function()  # Ray's ingress only: Ray's own

    def context(ray_requests, per_replica, replicas=2):
        return AutoscalingContext(
            deployment_id=None, deployment_name="skattn", app_name="a",
            current_num_replicas=replicas, target_num_replicas=2, running_replicas=[],
            total_num_requests=ray_requests, total_queued_requests=0,
            aggregated_metrics={SHARED_PORT_ONGOING: dict(enumerate(per_replica))},
            raw_metrics=None, capacity_adjusted_min_replicas=1,
            capacity_adjusted_max_replicas=4, policy_state={}, last_scale_up_time=None,
            last_scale_down_time=None, current_time=None, config=shared,
        )  # fmt: skip

    assert shared_port_policy(context(0, [30.0, 26.0])) == (7.0, {})  # (0 + 56) / 8
    assert shared_port_policy(context(8, [4.0, 4.0])) == (2.0, {})  # Ray's and the port's
    assert shared_port_policy(context(4, []))[0] == 0.5  # no replica has reported yet
    assert shared_port_policy(context(5, [], replicas=0))[0] == 2  # Ray's target at start
    # as Ray's controller wraps it: rounded up, its delays (none up here); the controller
    # then bounds the number by min_replicas and max_replicas
    from ray.serve.autoscaling_policy import _apply_autoscaling_config

    as_ray_runs_it = _apply_autoscaling_config(shared_port_policy)
    assert as_ray_runs_it(context(0, [9.0, 4.0]))[0] == 2  # 13 / 8 -> 2
    assert as_ray_runs_it(context(3, [0.0, 0.0]))[0] == 2  # down waits downscale_delay_s


def test_a_replica_reports_its_shared_ports_requests_in_flight():
    from types import SimpleNamespace

    from serving.ray_autoscaling import SHARED_PORT_ONGOING
    from serving.ray_deployment import ServerReplica

    replica = SimpleNamespace(listener=SimpleNamespace(ongoing=12))
    assert ServerReplica.record_autoscaling_stats(replica) == {SHARED_PORT_ONGOING: 12.0}
    assert ServerReplica.record_autoscaling_stats(SimpleNamespace(listener=None)) == {}


def test_a_replica_runs_on_cuda_only_with_a_gpu_reserved():
    """Ray hides no GPU from a replica that reserved none: device "auto" would have taken
    one unreserved on a GPU node."""
    default = build({**UNREAD, "model_dir": "/m/reverse"})._bound_deployment
    assert default.init_args[-1] == "cpu" and "num_gpus" not in default.ray_actor_options
    gpu = build({**UNREAD, "model_dir": "/m/reverse", "num_gpus": "1"})._bound_deployment
    # serving.load's "auto": CUDA, or the CPU for an int8 artifact ("cuda" refused those)
    assert gpu.init_args[-1] == "auto" and gpu.ray_actor_options["num_gpus"] == 1.0
    cpu = build({**UNREAD, "model_dir": "/m/reverse", "num_gpus": "1", "device": "cpu"})
    assert cpu._bound_deployment.init_args[-1] == "cpu"


def test_builder_passes_the_shared_port_to_every_replica():
    def kwargs(**args):
        return build({**UNREAD, "model_dir": "/m/reverse", **args})._bound_deployment.init_kwargs

    none = {"connection_limits": {}, "close_grace": 0.5}
    assert kwargs() == {"shared_port": None, **none}  # Ray's ingress only
    assert kwargs(shared_port="8100") == {"shared_port": ("127.0.0.1", 8100), **none}
    assert kwargs(shared_port=8100, shared_host="0.0.0.0")["shared_port"] == ("0.0.0.0", 8100)
    assert kwargs(shared_port=8100, shared_host="[::1]")["shared_port"] == ("::1", 8100)
    limits = kwargs(shared_port="8100", max_connections="1024", keep_alive_s="2.5")
    assert limits["connection_limits"] == {"max_connections": 1024, "keep_alive_s": 2.5}
    aged = kwargs(shared_port="8100", max_connection_age_s="30")  # (its default is None)
    assert aged["connection_limits"] == {"max_connection_age_s": 30.0}
    for none in ("none", None):  # no limit, said explicitly (YAML's null)
        unaged = kwargs(shared_port="8100", max_connection_age_s=none)["connection_limits"]
        assert unaged == {"max_connection_age_s": None}
    lingerless = kwargs(shared_port="8100", linger_s="0")["connection_limits"]
    assert lingerless == {"linger_s": 0.0}
    assert kwargs(shared_port="8100", shared_close_grace_s="2")["close_grace"] == 2.0


def test_a_replicas_shared_port_serves_with_the_limits_given():
    from types import SimpleNamespace

    from serving.ray_deployment import ServerReplica
    from serving.settings import ServerSettings
    from serving.shared_port import bind_shared_port

    sock = bind_shared_port("127.0.0.1", 0)
    replica = SimpleNamespace(
        server=lambda scope, receive, send: None, replica="r1", shared_socket=sock,
        log_level="info", settings=ServerSettings(retry_after_s=7),
        connection_limits={"max_connections": 1024, "header_timeout_s": 3.0}, listener=None,
        close_grace=1.5,
    )  # fmt: skip
    try:
        listener = ServerReplica.__serve_build_asgi_app__(replica)
        assert listener is replica.listener and listener.sock is sock
        assert (listener.limits.max_connections, listener.limits.header_timeout_s) == (1024, 3.0)
        assert listener.limits.retry_after_s == 7  # the queue's 503 and the bound's alike
        assert listener.limits.keep_alive_s == 5.0  # the others: python -m serving's defaults
        assert listener.close_grace == 1.5
    finally:
        sock.close()


def test_a_replica_on_a_node_without_tcp_migrate_req_warns(monkeypatch, caplog):
    """build warns on its own node only, and only when autoscaling; each replica warns on the
    node it runs on (a redeploy stops replicas too)."""
    from types import SimpleNamespace

    import serving.ray_deployment as ray_deployment
    from serving.settings import ServerSettings
    from serving.shared_port import bind_shared_port

    monkeypatch.setattr(ray_deployment, "migration_warning", lambda: "tcp_migrate_req is 0 here")
    sock = bind_shared_port("127.0.0.1", 0)
    replica = SimpleNamespace(
        server=lambda scope, receive, send: None, replica="r1", shared_socket=sock,
        log_level="info", settings=ServerSettings(), connection_limits={}, listener=None,
        close_grace=0.5,
    )  # fmt: skip
    try:
        with caplog.at_level("WARNING", logger="serving.ray_deployment"):
            ray_deployment.ServerReplica.__serve_build_asgi_app__(replica)
    finally:
        sock.close()
    assert "tcp_migrate_req is 0 here" in caplog.text


def test_a_replicas_health_check_raises_when_its_shared_port_stopped_serving():
    from types import SimpleNamespace

    from serving.ray_deployment import ServerReplica

    running = SimpleNamespace(running=True)
    server = SimpleNamespace(state=SimpleNamespace(models={"m": SimpleNamespace(batcher=running)}))
    listener = SimpleNamespace(failed=False, address="127.0.0.1:8100", error=None)
    replica = SimpleNamespace(server=server, listener=listener, replica="r1")
    ServerReplica.check_health(replica)  # healthy
    listener.failed, listener.error = True, "OSError(24, 'Too many open files')"
    with pytest.raises(RuntimeError, match=r"r1: the shared port 127\.0\.0\.1:8100 stopped .*open"):
        ServerReplica.check_health(replica)


def test_a_replicas_instances_share_its_cpus():
    def threads(**args):
        return build({**UNREAD, "model_dir": "/m/reverse", **args})._bound_deployment.init_args[2]

    assert threads() == 1
    assert threads(num_cpus="4") == 4
    assert threads(num_cpus="4", instances="2") == 2
    assert threads(num_cpus="1", instances="2") == 1  # at least one each


def test_builder_sets_the_replicas_logging():
    # Ray's access log off by default (the app logs its own line per inference request)
    default = build({**UNREAD, "model_dir": "/m/reverse"})._bound_deployment
    config = default.logging_config
    assert (config["log_level"], config["enable_access_log"]) == ("INFO", False)
    assert default.init_args[3] == "info"  # the server's own loggers in each replica
    custom = build(
        {**UNREAD, "model_dir": "/m/reverse", "log_level": "WARNING", "access_log": "true"}
    )
    config = custom._bound_deployment.logging_config
    assert (config["log_level"], config["enable_access_log"]) == ("WARNING", True)
    assert custom._bound_deployment.init_args[3] == "warning"


def test_a_replica_logs_the_server_as_json_lines_at_its_level(capsys):
    import json
    import logging

    from serving.process import configure_logging

    logger = logging.getLogger("serving")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    try:
        configure_logging("warning", "serving")  # what ServerReplica.__init__ does
        logging.getLogger("serving.app").info("not at warning")
        logging.getLogger("serving.app").warning("kept", extra={"model": "reverse"})
        lines = capsys.readouterr().err.splitlines()
        assert [json.loads(line)["message"] for line in lines] == ["kept"]
        assert json.loads(lines[0])["model"] == "reverse"
        assert not logger.propagate  # not twice through a Ray worker's root handlers
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved

"""The Kubernetes / KServe files in deploy/: the InferenceService manifest has the fields KServe
requires of a custom predictor, its probes and arguments fit the server, and the image installs
the server side only. (No cluster and no docker daemon run here: this checks the files.)"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path

import httpx
import pytest
import yaml
from serving_doubles import ReverseRuntime

from serving.__main__ import build_parser
from serving.app import create_app

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@pytest.fixture(scope="module")
def manifest() -> dict:
    (document,) = yaml.safe_load_all((DEPLOY / "kserve" / "inferenceservice.yaml").read_text())
    return document


@pytest.fixture(scope="module")
def container(manifest) -> dict:
    (container,) = manifest["spec"]["predictor"]["containers"]
    return container


def _dockerfile_exec_form(instruction: str) -> list[str]:
    (line,) = [
        line
        for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if line.startswith(instruction)
    ]
    return json.loads(line.removeprefix(instruction))


def test_the_manifest_is_a_kserve_inferenceservice_with_a_custom_predictor(manifest, container):
    assert manifest["apiVersion"] == "serving.kserve.io/v1beta1"
    assert manifest["kind"] == "InferenceService"
    assert DNS_1035_LABEL.match(manifest["metadata"]["name"])
    predictor = manifest["spec"]["predictor"]
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    assert container["name"] == "kserve-container"  # the name KServe looks for
    assert isinstance(container["image"], str) and container["image"]
    (port,) = container["ports"]
    assert isinstance(port["containerPort"], int) and port["protocol"] == "TCP"
    assert all(isinstance(arg, str) for arg in container["args"])  # Kubernetes wants strings
    env = {item["name"]: item["value"] for item in container["env"]}
    assert "://" in env["STORAGE_URI"]  # the storage initializer fills /mnt/models
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}


def test_the_probes_are_the_servers_health_routes_on_its_port(container):
    port = container["ports"][0]["containerPort"]
    live, ready = container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]
    assert (live["path"], live["port"]) == ("/v2/health/live", port)
    assert (ready["path"], ready["port"]) == ("/v2/health/ready", port)
    assert asyncio.run(_statuses([live["path"], ready["path"]])) == [200, 200]


async def _statuses(paths: list[str]) -> list[int]:
    """The server app's answers to GETs of ``paths`` once its lifespan has started it."""
    app = create_app({"reverse": ReverseRuntime()})
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return [(await client.get(path)).status_code for path in paths]


def test_the_image_runs_the_server_with_the_manifests_arguments(container):
    entrypoint = _dockerfile_exec_form("ENTRYPOINT ")
    assert entrypoint[:3] == ["python", "-m", "serving"]
    # Kubernetes' args replace the image's CMD and follow its ENTRYPOINT
    for args in (_dockerfile_exec_form("CMD "), container["args"]):
        parsed = build_parser().parse_args(entrypoint[3:] + args)
        assert parsed.host == "0.0.0.0" and parsed.port == container["ports"][0]["containerPort"]
        assert [str(path) for _, path in parsed.model_dir] == ["/mnt/models"]


def _dockerfile_args() -> dict[str, str]:
    """The Dockerfile's ``ARG NAME=default`` lines."""
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    return dict(line.split(None, 1)[1].split("=", 1) for line in lines if line.startswith("ARG "))


def test_the_image_installs_the_server_side_only():
    installs = [
        shlex.split(line.split("RUN ", 1)[1])
        for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if line.startswith("RUN ") and "pip install" in line
    ]
    assert installs == [["pip", "install", ".[serve,${ONNXRUNTIME}]", "&&", "rm", "-rf", "/src"]]
    # the flavour: the `cpu` extra by default, `gpu` on request, nothing else
    assert _dockerfile_args() == {"ONNXRUNTIME": "cpu"}
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    extras = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"cpu", "gpu"} <= set(extras)
    text = (DEPLOY / "Dockerfile").read_text().lower()
    assert "torch" not in text.replace("no torch", "") and "[train" not in text

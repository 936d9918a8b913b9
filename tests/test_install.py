"""The server-only install: ``pip install "skattn[serve,cpu]"`` serves an exported model.

A fresh virtual environment gets the project (built from a copy of its sources, as pip builds any
source tree) with only the ``serve`` and ``cpu`` extras. Neither torch nor scikit-learn may be
installed there, and ``python -m serving`` run from it must answer an inference request on an
artifact that this (full) environment exported exactly as ``serving.load(...).predict`` does here,
and it must hold the packaged models (``serving/models``) that this tree holds.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
# What a source distribution holds: the build configuration and the two packages.
SOURCES = ("pyproject.toml", "README.md", "skattn", "serving")
SERVER_ONLY = "serve,cpu"

CHECK_ENVIRONMENT = """
import importlib.util, json, sys
import serving, serving.__main__, serving.app, skattn.core.text
print(json.dumps({
    "missing": [name for name in ("torch", "sklearn") if importlib.util.find_spec(name) is None],
    "loaded": sorted({m.split(".")[0] for m in sys.modules} & {"torch", "sklearn"}),
    "serving": serving.__file__,
    "skattn": skattn.core.text.__file__,
    "packaged": serving.packaged_models(),
}))
"""


def clean_env() -> dict[str, str]:
    """This process's environment without what would leak the outer one into the new venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run(command: list[str], *, timeout: float, cwd: Path) -> str:
    """Run ``command``; on a non-zero exit or a timeout, fail the test with its output's tail."""
    try:
        done = subprocess.run(
            command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"")[-4000:], (exc.stderr or b"")[-4000:]
        pytest.fail(f"{command[:4]} did not finish in {timeout} s: {output}")
    if done.returncode != 0:
        pytest.fail(
            f"{command[:4]} exited {done.returncode}\n"
            f"stdout: {done.stdout[-4000:]}\nstderr: {done.stderr[-4000:]}"
        )
    return done.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_server_only_install_has_no_torch_or_sklearn_and_serves_an_export(
    fitted_reversal, tmp_path
):
    import serving

    artifact = fitted_reversal.export_onnx(tmp_path / "reversal")
    sources = ["123", "98765", "4", ""]
    expected = serving.load(artifact, device="cpu").predict(sources)

    # 1. the project's sources, copied: the build leaves nothing in the tree (and sees no .venv)
    source = tmp_path / "skattn-src"
    source.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=junk)
        else:
            shutil.copy2(REPO / name, source / name)

    # 2. a fresh virtual environment with only the server's extras
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], timeout=180, cwd=tmp_path)
    python = str(venv / "bin" / "python")
    started = time.monotonic()
    run(
        [python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
         "--progress-bar", "off", f"{source}[{SERVER_ONLY}]"],
        timeout=480, cwd=tmp_path,
    )  # fmt: skip
    print(f"pip install .[{SERVER_ONLY}]: {time.monotonic() - started:.0f} s")

    # 3. run from outside the repository, so only the installed packages can be imported
    report = json.loads(run([python, "-c", CHECK_ENVIRONMENT], timeout=120, cwd=tmp_path))
    assert report["missing"] == ["torch", "sklearn"], report
    assert report["loaded"] == [], report
    for package in ("serving", "skattn"):
        assert Path(report[package]).is_relative_to(venv), report
    assert report["packaged"] == serving.packaged_models()  # the packaged models install too

    # 4. the installed server answers as the runtime does here
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [python, "-m", "serving", "--model-dir", str(artifact), "--model-name", "reverse",
             "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
            cwd=tmp_path, env=clean_env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited {process.returncode}: {log_path.read_text()}")
            try:
                if httpx.get(f"{base}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:  # not listening yet
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server was not ready in 90 s: {log_path.read_text()}")
            time.sleep(0.2)
        body = {"inputs": [{"name": "source", "shape": [len(sources)], "datatype": "BYTES",
                            "data": sources}]}  # fmt: skip
        response = httpx.post(f"{base}/v2/models/reverse/infer", json=body, timeout=30)
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    assert response.status_code == 200, response.text
    [output] = response.json()["outputs"]
    assert output["name"] == "prediction" and output["shape"] == [len(sources)]
    assert output["data"] == expected
    assert returncode == 0, log_path.read_text()


def test_the_onnxruntime_flavours_exclude_each_other_and_gpu_brings_cuda():
    """``cpu`` and ``gpu`` install packages that overwrite each other: neither extra may pull
    the other's, and ``gpu`` must bring the CUDA and cuDNN libraries that a torch-free server
    on a driver-only machine needs (onnxruntime-gpu's ``cuda`` and ``cudnn`` extras)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    Requirement = pytest.importorskip("packaging.requirements").Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    cpu = {Requirement(r).name: Requirement(r) for r in extras["cpu"]}
    gpu = {Requirement(r).name: Requirement(r) for r in extras["gpu"]}
    assert "onnxruntime" in cpu and "onnxruntime-gpu" not in cpu
    assert "onnxruntime-gpu" in gpu and "onnxruntime" not in gpu
    assert {"cuda", "cudnn"} <= gpu["onnxruntime-gpu"].extras
    assert not gpu["onnxruntime-gpu"].specifier.contains("1.20.1")  # preload_dlls: 1.21 on
    for name in ("serve", "train"):  # the other extras leave the flavour to the user
        assert not {Requirement(r).name for r in extras[name]} & {"onnxruntime", "onnxruntime-gpu"}

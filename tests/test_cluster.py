"""Searches and fits on real clusters on this machine: a Dask LocalCluster of 2 worker processes
and a local Ray head, both on 127.0.0.1; and the thread and device allotment they rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch
from sklearn.model_selection import GridSearchCV, KFold

from skattn import Seq2Seq, allotment
from skattn.allotment import Allotment
from skattn.cluster import local_dask_cluster
from skattn.core.checks import usable_cores
from skattn.datasets import make_reversal
from skattn.scoring import SCORERS

distributed = pytest.importorskip("distributed")
ray = pytest.importorskip("ray")

TINY = dict(embedding_dim=8, hidden_size=16, batch_size=8, max_steps=6, device="cpu")
GRID = {"scorer": ["dot", "additive"], "decoder": ["bahdanau", "luong"]}
DATA = make_reversal(48, 2, 6, random_state=3)


def _search() -> GridSearchCV:
    model = Seq2Seq(**TINY, early_stopping=False, random_state=0)
    cv = KFold(2, shuffle=True, random_state=0)
    return GridSearchCV(model, GRID, scoring=SCORERS["token_accuracy"], cv=cv, refit=True)


def _fit_report(n_threads: int | None = None) -> dict:
    """Fit a tiny model where this runs; the threads it trained with and its predictions."""
    model = Seq2Seq(**TINY, n_threads=n_threads, random_state=0).fit(*DATA)
    return {"pid": os.getpid(), "n_threads_": model.n_threads_, "after": torch.get_num_threads()}


@pytest.fixture(scope="module")
def serial_search() -> GridSearchCV:
    return _search().fit(*DATA)


def _assert_same_results(search: GridSearchCV, serial: GridSearchCV) -> None:
    for key in ["params", "rank_test_score", "mean_test_score", "split0_test_score"]:
        assert list(search.cv_results_[key]) == list(serial.cv_results_[key]), key
    assert len(set(serial.cv_results_["mean_test_score"])) > 1  # the ranks say something


def _assert_serves(search: GridSearchCV, tmp_path) -> None:
    import serving

    best = search.best_estimator_  # fitted on a worker, pickled back
    expected = best.predict(DATA[0][:8])
    assert serving.load(best.export_onnx(tmp_path / "artifact")).predict(DATA[0][:8]) == expected


# ---------------------------------------------------------------- the allotment rules


def test_default_threads_follow_the_engine_then_the_environment_then_the_cores():
    ray_task = Allotment("ray", cpus=2.0)
    assert allotment.default_threads(ray_task, {"OMP_NUM_THREADS": "1"}, cores=4) == 2
    assert allotment.default_threads(Allotment("ray", cpus=0.5), {}, cores=4) == 1
    assert allotment.default_threads(Allotment("ray", cpus=8.0), {}, cores=4) == 4
    assert allotment.default_threads(Allotment(), {"OMP_NUM_THREADS": "3"}, cores=4) == 3
    assert allotment.default_threads(Allotment(), {"OMP_NUM_THREADS": "x"}, cores=4) == 4
    assert allotment.default_threads(Allotment(), {"OMP_NUM_THREADS": "²"}, cores=4) == 4
    # OpenMP's list form sets each nesting level; torch's threads are the outer one
    assert allotment.default_threads(Allotment(), {"OMP_NUM_THREADS": "2,1"}, cores=4) == 2
    assert allotment.default_threads(Allotment(), {"OMP_NUM_THREADS": " 3 , 2"}, cores=4) == 3
    assert allotment.default_threads(Allotment("ray", cpus=float("inf")), {}, cores=4) == 4
    assert allotment.default_threads(Allotment("dask", nthreads=2), {}, cores=8) == 4
    assert allotment.default_threads(Allotment("dask", nthreads=16), {}, cores=8) == 1
    assert allotment.default_threads(Allotment(), {}, cores=1) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_workers": 0}, "n_workers"),  # a cluster of no workers: fits would wait forever
        ({"n_workers": -1}, "n_workers"),
        ({"n_workers": True}, "n_workers"),
        ({"n_workers": "2"}, "n_workers"),
        ({"n_workers": 1, "config": 5}, "config must be a mapping"),
    ],
)
def test_local_dask_cluster_refuses_bad_arguments_before_starting_anything(kwargs, match):
    with pytest.raises(ValueError, match=match):
        local_dask_cluster(**kwargs)


@pytest.mark.parametrize(
    ("given", "device_count", "device"),
    [
        (Allotment(), 0, "cpu"),
        (Allotment(), 2, "cuda"),
        (Allotment("ray", gpus=1.0), 1, "cuda:0"),  # Ray hides the GPUs it did not reserve
        (Allotment("ray", gpus=0.0), 4, "cpu"),  # a task that reserved none takes none
        (Allotment("dask", gpus=1.0, slot=0), 2, "cuda:0"),
        (Allotment("dask", gpus=1.0, slot=1), 2, "cuda:1"),
        (Allotment("dask", gpus=1.0, slot=3), 2, "cuda:1"),
        (Allotment("dask", gpus=0.0, slot=1), 2, "cpu"),
        (Allotment("dask", gpus=1.0, slot=1), 0, "cpu"),
    ],
)
def test_each_gpu_worker_gets_its_own_device(given, device_count, device):
    assert allotment.auto_device(given, device_count, environ={}) == device
    shared = {"CUDA_VISIBLE_DEVICES": "0,1"}  # one list for every worker: as if unset
    assert allotment.auto_device(given, device_count, environ=shared) == device


@pytest.mark.parametrize(
    ("slot", "visible", "device"),
    [
        (1, "1,0", "cuda:0"),  # dask-cuda: the worker's own GPU first; cuda:1 was GPU 0's
        (2, "2,3,0,1", "cuda:0"),
        (1, "3,2", "cuda:0"),  # a subset of the host's GPUs, rotated alike
        (2, "6,7,4,5", "cuda:0"),
        (1, "0,1", "cuda:1"),  # a list shared by the workers: slot mod count
        (1, "GPU-4a1b,GPU-77c0", "cuda:1"),  # UUIDs: no order to read
        (1, "2,0,1", "cuda:1"),  # not a rotation starting at the worker's
    ],
)
def test_a_dask_cuda_worker_takes_the_gpu_its_list_puts_first(slot, visible, device):
    given = Allotment("dask", gpus=1.0, slot=slot)
    count = len(visible.split(","))
    assert allotment.auto_device(given, count, {"CUDA_VISIBLE_DEVICES": visible}) == device


@pytest.mark.parametrize(
    ("name", "slot"), [(0, 0), (3, 3), ("1", 1), ("tcp://127.0.0.1:4000", 0), ("²", 0), (True, 0)]
)
def test_a_dask_workers_gpu_slot_comes_from_its_name(name, slot):
    assert allotment._slot(name) == slot  # dask worker --name 1 names it by a str


def test_explicit_n_threads_overrides_and_the_previous_count_is_restored():
    before = torch.get_num_threads()
    report = _fit_report(n_threads=3)
    assert report["n_threads_"] == 3 and report["after"] == before


def test_a_process_confined_to_one_core_trains_and_predicts_on_one_thread():
    code = (
        "import os, json, torch\n"
        "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
        "torch_default = torch.get_num_threads()  # torch ignores the mask\n"
        "from skattn import Seq2Seq, allotment\n"
        "from skattn.datasets import make_reversal\n"
        "X, y = make_reversal(16, 2, 4, random_state=0)\n"
        "m = Seq2Seq(embedding_dim=8, hidden_size=16, max_steps=2, device='cpu').fit(X, y)\n"
        "with allotment.torch_threads(None) as n:  # what predict runs under\n"
        "    inside = torch.get_num_threads()\n"
        "m.predict(X)\n"
        "print(json.dumps([m.n_threads_, n, inside, torch_default, torch.get_num_threads()]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    fitted, default, inside, torch_default, after = json.loads(run.stdout.splitlines()[-1])
    assert fitted == default == inside == 1
    assert after == torch_default  # restored after fit and predict


@pytest.mark.slow  # two worker processes that import torch
def test_loky_workers_train_with_joblibs_cap():
    cap = os.environ.get("OMP_NUM_THREADS") or str(max(joblib.cpu_count() // 2, 1))
    reports = joblib.Parallel(n_jobs=2, backend="loky")(joblib.delayed(_fit_report)() for _ in "ab")
    assert [r["n_threads_"] for r in reports] == [int(cap)] * 2


# ---------------------------------------------------------------- Dask


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client

    environ = dict(os.environ)
    cluster = local_dask_cluster(2)  # under DASK_WORKER_CONFIG
    # the nanny's worker environment (OMP_NUM_THREADS=1) does not stay in this process
    assert dict(os.environ) == environ
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


def _worker_state(dask_worker) -> tuple[bool, list[str], bool]:
    import dask

    enabled = dask.config.get("distributed.worker.profile.enabled")
    # what the first optimizer would import, there before any task ran (not left by a fit)
    warm = "torch._dynamo" in sys.modules and dask_worker.state.executed_count == 0
    return enabled, [preload.name for preload in dask_worker.preloads], warm


def _scheduler_saturation(dask_scheduler) -> float:
    return dask_scheduler.WORKER_SATURATION


@pytest.mark.slow
def test_dask_worker_config_reaches_the_workers(dask_client):
    # each worker started with its profiler off and warmed up by the preload before any task
    state = (False, ["skattn.cluster"], True)
    assert list(dask_client.run(_worker_state).values()) == [state] * 2
    # the scheduler keeps the queue: a fit goes to whichever worker is free
    assert dask_client.run_on_scheduler(_scheduler_saturation) == 1.0


@pytest.mark.slow
def test_a_restarted_worker_has_one_thread_and_this_process_keeps_its_own(dask_client):
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    threads = {name: os.environ.get(name) for name in names}
    dask_client.restart()  # the nanny spawns the workers again (and sets its other variables)
    assert {name: os.environ.get(name) for name in names} == threads
    assert set(dask_client.run(lambda: os.environ.get("OMP_NUM_THREADS")).values()) == {"1"}


@pytest.mark.slow
def test_dask_workers_train_with_their_nthreads(dask_client):
    workers = dask_client.scheduler_info()["workers"]
    assert len(workers) == 2
    for address, info in workers.items():
        report = dask_client.submit(_fit_report, workers=[address], pure=False).result()
        assert report["n_threads_"] == info["nthreads"] == 1


@pytest.mark.slow
def test_grid_search_on_dask_equals_the_serial_search(dask_client, serial_search, tmp_path):
    search = _search()
    with joblib.parallel_backend("dask"):
        search.fit(*DATA)
    _assert_same_results(search, serial_search)
    _assert_serves(search, tmp_path)


def _run_example(tmp_path, *args: str) -> str:
    """examples/grid_search_cluster.py --quick ARGS: its output; the best model's refit runs in
    the example's own process, on the cores it may use (not on a worker's one thread: the
    local cluster's nanny no longer leaves OMP_NUM_THREADS=1 behind in this process)."""
    example = Path(__file__).resolve().parents[1] / "examples" / "grid_search_cluster.py"
    # not this process's OMP_NUM_THREADS, which a Ray head started by an earlier test may have
    # set (ray.init sets it in its driver)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    run = subprocess.run(
        [sys.executable, str(example), "--quick", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"trained with\n{usable_cores()} thread(s)" in run.stdout
    return run.stdout


@pytest.mark.slow
def test_the_example_searches_on_a_given_dask_scheduler(dask_client, tmp_path):
    out = _run_example(tmp_path, "--scheduler", dask_client.scheduler.address)
    assert "3 configurations x 2 folds on dask, 2 threads" in out


@pytest.mark.slow
def test_the_example_starts_a_local_dask_cluster_of_its_workers(tmp_path):
    out = _run_example(tmp_path, "--workers", "2")
    assert "3 configurations x 2 folds on dask, 2 threads" in out


# ---------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_head():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is no package
    from ray.util.joblib import register_ray

    register_ray()
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("num_cpus", [1, 2])
def test_ray_tasks_train_with_their_num_cpus(ray_head, num_cpus):
    # Ray starts its workers with OMP_NUM_THREADS=1, so torch alone would take 1 thread here
    report = ray.get(ray.remote(num_cpus=num_cpus)(_fit_report).remote())
    assert report["n_threads_"] == num_cpus


@pytest.mark.slow
def test_grid_search_on_ray_equals_the_serial_search(ray_head, serial_search, tmp_path):
    search = _search()
    with joblib.parallel_backend("ray"):
        search.fit(*DATA)
    _assert_same_results(search, serial_search)
    _assert_serves(search, tmp_path)
    assert np.isfinite(search.best_score_)

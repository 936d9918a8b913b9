"""Continuous batching (serving.continuous) over real exported models: every answer equals
``runtime.predict_batch``'s, items join the running steps and leave the step they end, and
the models whose steps read the position are batched dynamically instead."""

import asyncio
import logging
import random
import time

import httpx
import numpy as np
import pytest
from serving_doubles import ReverseRuntime
from test_batcher import (
    RecordingMetrics,
    behind_another_models_batch,
    run,
    worker_after_a_cancel_mid_call,
)
from test_runtime import SOURCES, TRANSFORMER_PARAMS, fit, load
from test_server import MODEL, infer_body, one_item_requests_at_once

from serving.batch_items import BatcherClosedError, BatchError
from serving.batch_policy import choose_admissions
from serving.batcher import Batcher
from serving.continuous import ContinuousBatcher
from serving.running import RunningDecode, continuous_support
from skattn import Seq2SeqEnsemble

KINDS = {
    "bahdanau-additive": dict(decoder="bahdanau", scorer="additive"),
    "luong-general-feeding": dict(decoder="luong", scorer="general"),
    "luong-dot-local-p-lstm": dict(decoder="luong", attention="local-p", cell="lstm"),
    "luong-none": dict(decoder="luong", attention="none"),
    "transformer-encoder-bahdanau": dict(
        encoder="transformer", decoder="bahdanau", num_heads=2, num_layers=1
    ),
}


@pytest.fixture(scope="module")
def fitted():
    return {name: fit(**params) for name, params in KINDS.items()}


@pytest.fixture(scope="module")
def runtimes(fitted, tmp_path_factory):
    root = tmp_path_factory.mktemp("continuous")
    loaded = {name: load(model.export_onnx(root / name)) for name, model in fitted.items()}
    members = [fitted["bahdanau-additive"], fitted["luong-general-feeding"]]
    ensemble = Seq2SeqEnsemble.from_fitted(members)
    loaded["ensemble"] = load(ensemble.export_onnx(root / "ensemble"))
    return loaded


async def started(runtime, **settings) -> ContinuousBatcher:
    batcher = ContinuousBatcher(runtime, **settings)
    await batcher.start()
    return batcher


def assert_same(expected, got):
    (want_predictions, want_maps), (predictions, maps) = expected, got
    assert predictions == want_predictions
    for want, have in zip(want_maps, maps, strict=True):
        assert have.shape == want.shape
        np.testing.assert_allclose(have, want, atol=1e-5)


@pytest.mark.parametrize("kind", [*KINDS, "ensemble"])
def test_staggered_concurrent_requests_get_the_runtimes_answers(runtimes, kind, monkeypatch):
    """Requests of 1-5 items arrive while others run: the set's rows are re-padded as longer
    sources join and trimmed as they leave, and every item's prediction and map is
    ``predict_batch``'s."""
    runtime = runtimes[kind]
    assert continuous_support(runtime) is None
    expected = runtime.predict_batch(SOURCES, with_attention=True)
    rng = random.Random(0)
    joined_at = []  # the rows already running whenever items joined
    admit = RunningDecode.admit

    def recording_admit(self, keys, sources):
        joined_at.append(self.size)
        admit(self, keys, sources)

    monkeypatch.setattr(RunningDecode, "admit", recording_admit)

    async def body():
        metrics = RecordingMetrics()
        batcher = await started(runtime, max_batch_size=16, metrics=metrics)
        requests, start = [], 0
        while start < len(SOURCES):
            n = rng.randint(1, 5)
            requests.append(range(start, min(start + n, len(SOURCES))))
            start += n

        async def client(rows):
            await asyncio.sleep(rng.random() * 0.05)
            return rows, await batcher.results(
                batcher.submit([SOURCES[i] for i in rows], with_attention=True)
            )

        answers = await asyncio.gather(*(client(rows) for rows in requests))
        await batcher.stop()
        return answers, metrics

    answers, metrics = run(body())
    predictions = [None] * len(SOURCES)
    maps = [None] * len(SOURCES)
    for rows, results in answers:
        for i, result in zip(rows, results, strict=True):
            predictions[i], maps[i] = result.prediction, result.attention
    assert_same(expected, (predictions, maps))
    sizes = [size for size, failed in metrics.batches]
    assert not any(failed for _, failed in metrics.batches)
    assert max(sizes) <= 16
    assert sum(joined_at) > 0  # items joined rows that were part-way


def test_a_short_item_is_answered_while_a_long_one_still_runs(runtimes, monkeypatch):
    runtime = runtimes["bahdanau-additive"]
    # the barely trained model's longest and shortest answers among these (its output lengths
    # follow its training, not the sources' lengths)
    candidates = ["abcdefabcdefabc", *SOURCES]
    answers = runtime.predict(candidates)
    long_source = max(candidates, key=lambda s: len(answers[candidates.index(s)]))
    short_source = min(candidates, key=lambda s: len(answers[candidates.index(s)]))
    step = runtime.backend.step

    def slow_step(*args, **kwargs):  # the long item cannot end before the short one joins
        time.sleep(0.005)
        return step(*args, **kwargs)

    monkeypatch.setattr(runtime.backend, "step", slow_step)

    async def body():
        batcher = await started(runtime)
        order = []

        async def ask(source, delay):
            await asyncio.sleep(delay)
            (result,) = await batcher.results(batcher.submit([source]))
            order.append(source)
            return result.prediction

        long_task = asyncio.create_task(ask(long_source, 0))
        while not batcher._running:  # the long item is running
            await asyncio.sleep(0)
        short = await ask(short_source, 0)
        assert not long_task.done()
        long = await long_task
        await batcher.stop()
        return order, short, long

    order, short, long = run(body())
    assert order == [short_source, long_source]
    assert [short, long] == runtime.predict([short_source, long_source])
    assert len(long) > len(short) + 2  # the long item ran steps after the short one ended


def test_cancelled_items_leave_the_running_set_and_the_rest_are_answered(runtimes):
    runtime = runtimes["luong-general-feeding"]
    sources = [s for s in SOURCES if len(s) >= 10][:40]  # long outputs: many steps each

    async def body():
        metrics = RecordingMetrics()
        batcher = await started(runtime, max_batch_size=64, metrics=metrics)
        gone = batcher.submit(sources[:20])
        kept = batcher.submit(sources[20:])
        while len(batcher._running) < 40:
            await asyncio.sleep(0)
        withdrawn_at = len(metrics.batches)
        batcher.withdraw(gone)
        results = await batcher.results(kept)
        await batcher.stop()
        return [r.prediction for r in results], metrics.batches, withdrawn_at

    predictions, batches, withdrawn_at = run(body())
    assert predictions == runtime.predict(sources[20:])
    assert not any(failed for _, failed in batches)
    # After the run of steps in flight at the withdrawal, only the 20 kept rows are stepped.
    later = [size for size, _ in batches[withdrawn_at + 1 :]]
    assert later and max(later) <= 20


def test_when_every_caller_leaves_the_next_request_starts_afresh(runtimes):
    runtime = runtimes["bahdanau-additive"]
    sources = [s for s in SOURCES if len(s) >= 10][:8]

    async def body():
        metrics = RecordingMetrics()
        batcher = await started(runtime, metrics=metrics)
        gone = batcher.submit(sources)
        while not batcher._running:
            await asyncio.sleep(0)
        batcher.withdraw(gone)
        while batcher._running:
            await asyncio.sleep(0.001)
        results = await batcher.results(batcher.submit(sources[:3]))
        await batcher.stop()
        return [r.prediction for r in results], metrics.batches

    predictions, batches = run(body())
    assert predictions == runtime.predict(sources[:3])
    assert not any(failed for _, failed in batches)
    assert batches[-1][0] <= 3  # the new request's rows alone


def test_items_that_replace_a_withdrawn_set_run_at_their_own_temperature(runtimes):
    runtime = runtimes["bahdanau-additive"]
    long = [s for s in SOURCES if len(s) >= 10][:16]
    sources = SOURCES[:6]

    async def body():
        batcher = await started(runtime)
        gone = batcher.submit(long, temperature=1.0)
        while len(batcher._running) < len(long):
            await asyncio.sleep(0)
        batcher.withdraw(gone)  # every running item leaves, and in the same tick ...
        cold = batcher.submit(sources, temperature=0.001, with_attention=True)  # ... these join
        results = await batcher.results(cold)
        await batcher.stop()
        return [r.prediction for r in results], [r.attention for r in results]

    expected = runtime.predict_batch(sources, 0.001, with_attention=True)
    assert_same(expected, run(body()))  # once answered at the withdrawn set's temperature, 1.0


@pytest.mark.parametrize("fail_at", ["admit", "step"])
def test_a_failing_step_is_redone_with_bisection_and_only_the_bad_item_fails(
    runtimes, monkeypatch, fail_at
):
    """The continuous path fails once, on admission or part-way (its third step, with rows
    running); the items in the set are decoded again with bisection, where only the bad item
    fails, and the next request runs continuously again."""
    runtime = runtimes["bahdanau-additive"]
    sources = ["abcdef", "boom", "cabbed", "fedcba"]
    predict_batch = runtime.predict_batch
    calls = {"admit": 0, "step": 0}
    original = {"admit": RunningDecode.admit, "step": RunningDecode.step}

    def failing_predict_batch(batch, *args, **kwargs):
        if "boom" in batch:
            raise RuntimeError("this item cannot be decoded")
        return predict_batch(batch, *args, **kwargs)

    def failing(name, fail_on):
        def method(self, *args):
            calls[name] += 1
            if calls[name] == fail_on:
                raise RuntimeError(f"the {name} failed")
            return original[name](self, *args)

        return method

    monkeypatch.setattr(runtime, "predict_batch", failing_predict_batch)
    monkeypatch.setattr(RunningDecode, fail_at, failing(fail_at, 1 if fail_at == "admit" else 3))

    async def body():
        metrics = RecordingMetrics()
        batcher = await started(runtime, metrics=metrics)
        outcomes = []
        for future in batcher.submit(sources):
            try:
                outcomes.append((await future).prediction)
            except BatchError as error:
                outcomes.append(error)
        after = await batcher.results(batcher.submit(["abc"]))
        await batcher.stop()
        return outcomes, after[0].prediction, metrics.batches

    outcomes, after, batches = run(body())
    assert isinstance(outcomes[1], BatchError)
    good = [0, 2, 3]
    assert [outcomes[i] for i in good] == predict_batch([sources[i] for i in good])[0]
    assert [after] == predict_batch(["abc"])[0]
    assert calls[fail_at] >= (1 if fail_at == "admit" else 3)
    assert batches[0][0] == 4  # all four items entered the set together
    # a continuous hop failed (on admission, the first; part-way, the one holding the third
    # step, whichever items the barely trained model had ended by then)
    assert batches[0] == (4, True) if fail_at == "admit" else any(f for _, f in batches[:-1])
    assert batches[-1] == (1, False)  # then "abc" ran continuously


def test_temperatures_take_turns_and_never_share_a_step(runtimes):
    runtime = runtimes["bahdanau-additive"]
    sources = SOURCES[:30]

    async def body():
        metrics = RecordingMetrics()
        batcher = await started(runtime, metrics=metrics)
        hot = batcher.submit(sources, temperature=2.0, with_attention=True)
        cold = batcher.submit(sources, temperature=0.5, with_attention=True)
        results = [await batcher.results(hot), await batcher.results(cold)]
        await batcher.stop()
        return results, metrics.batches

    (hot, cold), batches = run(body())
    assert not any(failed for _, failed in batches)
    for results, temperature in ((hot, 2.0), (cold, 0.5)):
        expected = runtime.predict_batch(sources, temperature, with_attention=True)
        assert_same(expected, ([r.prediction for r in results], [r.attention for r in results]))


def test_only_greedy_rnn_steps_without_local_m_on_host_memory_run_continuously(fitted, tmp_path):
    assert continuous_support(ReverseRuntime()) is not None
    beam = fit(beam_size=3)
    reason = continuous_support(load(beam.export_onnx(tmp_path / "beam")))
    assert "beam" in reason
    local_m = fit(decoder="luong", attention="local-m")
    reason = continuous_support(load(local_m.export_onnx(tmp_path / "local-m")))
    assert "position" in reason and "local-m" in reason
    transformer = fit(**TRANSFORMER_PARAMS, num_layers=1)
    reason = continuous_support(load(transformer.export_onnx(tmp_path / "transformer")))
    assert "position" in reason
    mixed = Seq2SeqEnsemble.from_fitted([fitted["bahdanau-additive"], local_m])
    reason = continuous_support(load(mixed.export_onnx(tmp_path / "ensemble")))
    assert "position" in reason  # one member's local-m is enough
    bound = load(fitted["bahdanau-additive"].export_onnx(tmp_path / "greedy"), io_binding=True)
    assert "IO binding" in continuous_support(bound)
    with pytest.raises(ValueError, match="cannot batch continuously"):
        ContinuousBatcher(ReverseRuntime())


def test_choose_admissions_takes_turns_keeps_the_limits_and_starves_no_one():
    class Item:
        def __init__(self, source, request, temperature=None, turn=None):
            self.source, self.request = source, request
            self.temperature, self.maps = temperature, None
            self.turn = request if turn is None else turn

    a = [Item("aaaa", 1, turn=4) for _ in range(3)]  # request 1 had its turn: behind 2 and 3
    b = [Item("bb", 2) for _ in range(2)]
    c = [Item("c" * 50, 3)]
    pending = [*a, *b, *c]
    # Requests take turns, one item each, in the order of their turn.
    chosen, rest = choose_admissions(pending, None, 0, 0, 4, 10_000)
    assert chosen == [b[0], c[0], a[0], b[1]]
    assert rest == [a[1], a[2]]
    # Rows and padded characters are bounded. An item that does not fit stops the admissions
    # after it: the set shrinks until it fits, instead of filling with shorter items for ever.
    for item in a:
        item.turn = 1
    chosen, rest = choose_admissions(pending, (None, None), 2, 4, 5, 20)
    assert chosen == [a[0], b[0]]
    assert rest == [a[1], a[2], b[1], c[0]]
    c[0].turn = 0  # its turn first: it does not fit beside 3 rows, so nothing joins
    chosen, _ = choose_admissions([c[0], *b], (None, None), 3, 4, 64, 100)
    assert chosen == []
    # The first item of an empty set joins whatever its length.
    chosen, _ = choose_admissions([c[0], *b], None, 0, 0, 64, 10)
    assert chosen == [c[0]]
    # While an item of another temperature waits, nothing joins the running set; once the set
    # is empty the oldest item leads, however many newer requests of the old key came after it.
    hot = Item("x", 4, temperature=2.0)
    newer = [Item("y", 5 + i) for i in range(3)]
    chosen, rest = choose_admissions([hot, *newer], (None, None), 1, 4, 8, 10_000)
    assert chosen == [] and rest == [hot, *newer]
    chosen, rest = choose_admissions([hot, *newer], None, 0, 0, 8, 10_000)
    assert chosen == [hot] and rest == newer


def test_a_request_s_later_items_join_under_steady_load():
    """A full set of 4 rows where one item ends and one one-item request arrives per step:
    request 1's second and third items used to wait behind every newer request for ever (turns
    ran after the last admitted request's number); now a request whose item joined goes behind
    the requests queued then (``Batcher._rotate``, as ``ContinuousBatcher._tick`` calls it)."""

    async def body():
        batcher = Batcher(ReverseRuntime(), max_batch_size=4, max_delay_ms=60_000)
        await batcher.start()
        batcher.submit(["a", "b", "c"])
        rows, joined = 4, []
        for _ in range(20):  # steps
            rows -= 1  # one running item ends ...
            batcher.submit(["z"])  # ... and one request arrives
            admitted, batcher._pending = choose_admissions(
                batcher._pending, (None, None), rows, 1, 4, 8192
            )
            batcher._rotate([item.request for item in admitted])
            rows += len(admitted)
            joined += [item.source for item in admitted if item.request == 1]
        batcher._pending.clear()
        await batcher.stop()
        return joined

    assert run(body()) == ["a", "b", "c"]


# -- the server --------------------------------------------------------------------------------


def test_the_server_batches_continuously_and_answers_as_the_runtime(serve, runtimes):
    runtime = runtimes["bahdanau-additive"]
    server = serve(runtime, batching="continuous")
    assert isinstance(server.batcher, ContinuousBatcher)
    sources = SOURCES[:24]
    assert one_item_requests_at_once(server, sources) == runtime.predict(sources)
    assert server.metric("skattn_batch_failures_total") == 0
    assert server.metric("skattn_batch_size_count") > 0


def test_a_model_that_cannot_run_continuously_is_batched_dynamically_with_a_warning(serve, caplog):
    with caplog.at_level(logging.WARNING, logger="serving.app"):
        server = serve(ReverseRuntime(), batching="continuous")
    assert type(server.batcher) is Batcher
    assert "batched dynamically" in caplog.text
    assert httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=infer_body(["abc"])).json()[
        "outputs"
    ][0]["data"] == ["cba"]


def test_the_batching_setting_is_validated():
    from serving.settings import ServerSettings

    with pytest.raises(ValueError, match="batching"):
        ServerSettings(batching="iteration")


def test_a_continuous_batcher_steps_one_running_set(runtimes):
    with pytest.raises(ValueError, match="instances=2: a continuous batcher steps one"):
        ContinuousBatcher(runtimes["bahdanau-additive"], instances=2)


def test_a_run_of_steps_cancelled_mid_call_frees_its_worker_when_the_steps_end(runtimes):
    """As the dynamic batcher's (test_batcher): the worker is freed by the run of steps that
    the cancelled scheduler left in its thread, when it ends, not by the scheduler."""
    import threading

    batcher = ContinuousBatcher(runtimes["bahdanau-additive"])
    steps, begun, gate = batcher._steps, threading.Event(), threading.Event()

    def held_steps(*args):
        begun.set()
        gate.wait(10)
        return steps(*args)

    batcher._steps = held_steps
    held = run(
        worker_after_a_cancel_mid_call(batcher, lambda: asyncio.to_thread(begun.wait, 10), gate.set)
    )
    assert held == (True, False, BatcherClosedError)


def test_a_continuous_batcher_sharing_the_thread_admits_and_times_from_when_it_is_free(
    runtimes,
):
    """Two models on one inference thread, as the server runs them: the continuous batcher's
    items that arrive while the other model's batch holds the thread all join its first run of
    steps, and they waited in the queue, not in a run of steps the metrics call inference."""
    runtime = runtimes["bahdanau-additive"]
    expected = runtime.predict_batch(SOURCES[:2])[0]

    def make_batcher(executor, metrics):
        return ContinuousBatcher(runtime, executor=executor, metrics=metrics)

    metrics, held, answers = run(behind_another_models_batch(make_batcher, SOURCES[:2]))
    assert held[0].prediction == "dloh"
    assert [answer[0].prediction for answer in answers] == expected
    assert metrics.batches[0] == (2, False)  # both joined the first run of steps
    assert min(metrics.waits) >= 0.3  # each waited while the thread ran the other model
    assert metrics.seconds[0] < min(metrics.waits)

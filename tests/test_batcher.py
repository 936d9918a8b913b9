"""Dynamic batching (serving.batcher) against a deterministic test-double runtime."""

import asyncio
import random
import threading
import time

import numpy as np
import pytest
from serving_doubles import FAIL_MARKER, ReverseRuntime, reverse_attention

from serving.batcher import (
    Batcher,
    BatcherClosedError,
    BatchError,
    ItemResult,
    QueueFullError,
)


def run(coroutine):
    """Run one async test body, bounded so that a scheduling bug fails instead of hanging."""

    async def bounded():
        return await asyncio.wait_for(coroutine, timeout=20)

    return asyncio.run(bounded())


async def batches_started(runtime: ReverseRuntime, count: int, timeout: float = 5.0) -> bool:
    """Whether ``count`` more batches enter the runtime (they may be held at its gate), each
    within ``timeout`` seconds."""
    for _ in range(count):
        if not await asyncio.to_thread(runtime.started.acquire, timeout=timeout):
            return False
    return True


async def wait_for_batches(runtime: ReverseRuntime, count: int) -> None:
    """Wait until ``count`` batches have entered the runtime; fail within :func:`run`'s bound."""
    assert await batches_started(runtime, count, timeout=20), f"{count} batches never started"


async def started(runtime: ReverseRuntime, **settings) -> Batcher:
    batcher = Batcher(runtime, **settings)
    await batcher.start()
    return batcher


class RecordingMetrics:
    def __init__(self):
        self.batches, self.seconds, self.waits, self.depths = [], [], [], []

    def batch(self, size, seconds, failed):
        self.batches.append((size, failed))
        self.seconds.append(seconds)

    def queue_wait(self, seconds):
        self.waits.append(seconds)

    def queue_depth(self, depth):
        self.depths.append(depth)


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": True}, "max_batch_size"),
        ({"max_batch_size": 2.0}, "max_batch_size"),
        ({"max_delay_ms": -1}, "max_delay_ms"),
        ({"max_delay_ms": float("nan")}, "max_delay_ms"),
        ({"max_delay_ms": "2"}, "max_delay_ms"),
        ({"max_delay_ms": 60_001}, "max_delay_ms"),
        ({"max_queue": 0}, "max_queue"),
        ({"eager": 1}, "eager"),
        ({"instances": 0}, "instances"),
        ({"instances": True}, "instances"),
        ({"instances": 2.0}, "instances"),
        ({"instances": 65}, "instances"),
    ],
)
def test_settings_are_validated_when_built(settings, name):
    with pytest.raises(ValueError, match=name):
        Batcher(ReverseRuntime(), **settings)


def test_runtime_without_predict_batch_is_refused():
    with pytest.raises(ValueError, match="runtime"):
        Batcher(object())


def test_a_full_batch_goes_at_once_without_waiting_for_the_delay():
    async def body():
        runtime = ReverseRuntime()
        batcher = await started(runtime, max_batch_size=4, max_delay_ms=60_000)
        results = await batcher.infer(["abc", "de", "f", "ghij"])
        await batcher.stop()
        return runtime, results

    runtime, results = run(body())
    assert [r.prediction for r in results] == ["cba", "ed", "f", "jihg"]
    assert runtime.batch_sizes == [4]


def test_concurrent_requests_merge_into_one_batch_within_the_delay():
    async def body():
        runtime = ReverseRuntime()
        batcher = await started(runtime, max_batch_size=64, max_delay_ms=200)
        results = await asyncio.gather(*(batcher.infer([f"s{i}"]) for i in range(5)))
        await batcher.stop()
        return runtime, results

    runtime, results = run(body())
    assert [r[0].prediction for r in results] == [f"{i}s" for i in range(5)]
    assert runtime.batch_sizes == [5]


def test_an_eager_batcher_runs_a_lone_item_without_waiting_for_the_delay():
    async def body():
        runtime = ReverseRuntime()
        batcher = await started(runtime, max_batch_size=64, max_delay_ms=60_000, eager=True)
        results = await batcher.infer(["abc"])  # a 60 s wait would fail the 20 s bound of run
        await batcher.stop()
        return runtime, results

    runtime, results = run(body())
    assert [r.prediction for r in results] == ["cba"]
    assert runtime.batch_sizes == [1]


def test_an_eager_batcher_waits_for_a_request_being_received():
    async def body():
        runtime = ReverseRuntime()
        batcher = await started(runtime, max_batch_size=64, max_delay_ms=60_000, eager=True)
        with batcher.receiving():  # request B is being read ...
            first = batcher.submit(["ab"])  # ... when request A joins the queue
            await asyncio.sleep(0.05)
            waited = not first[0].done()
            second = batcher.submit(["cde"])
        results = await batcher.results(first + second)
        await batcher.stop()
        return runtime, results, waited

    runtime, results, waited = run(body())
    assert waited
    assert [r.prediction for r in results] == ["ba", "edc"]
    assert runtime.batch_sizes == [2]


def test_an_eager_batcher_waits_at_most_the_delay_for_a_request_being_received():
    async def body():
        runtime = ReverseRuntime()
        batcher = await started(runtime, max_batch_size=64, max_delay_ms=20, eager=True)
        with batcher.receiving():  # a request that takes long to arrive
            first = await batcher.results(batcher.submit(["ab"]))
        await batcher.stop()
        return runtime, first

    runtime, first = run(body())
    assert [r.prediction for r in first] == ["ba"]
    assert runtime.batch_sizes == [1]


def test_a_stalled_read_does_not_hold_an_eager_batcher_back():
    async def body():
        runtime = ReverseRuntime()
        batcher = await started(runtime, max_batch_size=64, max_delay_ms=300, eager=True)
        with batcher.receiving():  # an upload that started and stalled
            await asyncio.sleep(0.35)  # older than max_delay: its items cannot be coming
            loop = asyncio.get_running_loop()
            latencies = []
            for source in ("ab", "cd", "ef"):
                sent = loop.time()
                await batcher.infer([source])
                latencies.append(loop.time() - sent)
        await batcher.stop()
        return runtime, latencies

    runtime, latencies = run(body())
    assert max(latencies) < 0.15, latencies  # not the 0.3 s delay
    assert runtime.batch_sizes == [1, 1, 1]


def test_a_request_of_long_items_takes_turns_with_the_requests_after_it():
    async def body():
        runtime = ReverseRuntime(gated=True, max_source_length=2000)
        batcher = await started(runtime, max_batch_size=64, max_delay_ms=0, max_batch_chars=8192)
        hold = batcher.submit(["hold"])
        await wait_for_batches(runtime, 1)
        long_request = batcher.submit([f"{i:04d}" * 250 for i in range(48)])  # 48 x 1,000
        short_request = batcher.submit(["short"])
        runtime.release()
        await asyncio.wait(hold + long_request + short_request)
        await batcher.stop()
        return runtime

    runtime = run(body())
    calls = [sources for sources, _, _ in runtime.calls]
    assert "short" in calls[2]  # after one batch of the long request, not after all six
    assert all(len(c) * max(map(len, c)) <= 8192 for c in calls[1:])
    assert sum(map(len, calls[1:])) == 49  # every item once


def test_more_items_than_max_batch_size_are_split_and_each_answered_once():
    async def body():
        runtime = ReverseRuntime()
        batcher = await started(runtime, max_batch_size=4, max_delay_ms=0)
        sources = [f"item{i}" for i in range(10)]
        results = await batcher.infer(sources)
        await batcher.stop()
        return runtime, sources, results

    runtime, sources, results = run(body())
    assert [r.prediction for r in results] == [s[::-1] for s in sources]
    assert max(runtime.batch_sizes) <= 4
    assert sorted(runtime.seen) == sorted(sources)


def test_items_are_grouped_by_source_length():
    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=3, max_delay_ms=0)
        first = asyncio.ensure_future(batcher.infer(["x"]))
        await wait_for_batches(runtime, 1)  # the worker is busy: the others queue up
        lengths = [1, 9, 2, 8, 3, 7]
        rest = [asyncio.ensure_future(batcher.infer(["a" * n])) for n in lengths]
        await asyncio.sleep(0)  # let every request join the queue
        runtime.release()
        await asyncio.gather(first, *rest)
        await batcher.stop()
        return runtime

    runtime = run(body())
    assert [[len(s) for s in sources] for sources, _, _ in runtime.calls] == [
        [1],
        [1, 2, 3],
        [7, 8, 9],
    ]


def test_a_request_naming_the_models_own_temperature_shares_the_batch_of_those_naming_none():
    from types import SimpleNamespace

    async def body():
        runtime = ReverseRuntime(gated=True)
        runtime.manifest = SimpleNamespace(temperature=1.0)
        batcher = await started(runtime, max_batch_size=64, max_delay_ms=0)
        first = asyncio.ensure_future(batcher.infer(["hold"]))
        await wait_for_batches(runtime, 1)
        requests = [
            asyncio.ensure_future(batcher.infer([f"src{i}"], temperature=t))
            for i, t in enumerate([None, 1.0, None, 0.5])
        ]
        await asyncio.sleep(0)
        runtime.release()
        await first
        await asyncio.gather(*requests)
        await batcher.stop()
        return runtime

    runtime = run(body())
    batches = [(sources, t) for sources, t, _ in runtime.calls[1:]]
    assert batches == [(["src0", "src1", "src2"], None), (["src3"], 0.5)]


def test_different_temperatures_never_share_a_batch():
    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=64, max_delay_ms=0)
        first = asyncio.ensure_future(batcher.infer(["hold"]))
        await wait_for_batches(runtime, 1)
        temperatures = [None, 0.5, None, 2.0, 0.5, 2.0]
        requests = [
            asyncio.ensure_future(batcher.infer([f"src{i}"], temperature=t, with_attention=True))
            for i, t in enumerate(temperatures)
        ]
        await asyncio.sleep(0)
        runtime.release()
        await first
        results = await asyncio.gather(*requests)
        await batcher.stop()
        return runtime, temperatures, results

    runtime, temperatures, results = run(body())
    batches = {t: sources for sources, t, _ in runtime.calls[1:]}
    assert len(runtime.calls) == 4  # the held one, then one batch per temperature
    assert batches == {None: ["src0", "src2"], 0.5: ["src1", "src4"], 2.0: ["src3", "src5"]}
    for i, (t, [result]) in enumerate(zip(temperatures, results, strict=True)):
        np.testing.assert_allclose(result.attention, reverse_attention(f"src{i}", t))


def test_attention_only_for_the_items_that_asked():
    async def body():
        runtime = ReverseRuntime()
        batcher = await started(runtime, max_batch_size=8, max_delay_ms=100)
        plain, mapped = await asyncio.gather(
            batcher.infer(["abc"]), batcher.infer(["hello"], with_attention=True)
        )
        await batcher.stop()
        return runtime, plain, mapped

    runtime, plain, mapped = run(body())
    assert runtime.batch_sizes == [2]  # one runtime call, with attention
    assert plain == [ItemResult("cba", None)]
    assert mapped[0].prediction == "olleh"
    np.testing.assert_allclose(mapped[0].attention, reverse_attention("hello"))


def test_a_failed_batch_fails_only_its_own_items_and_the_batcher_carries_on():
    async def body():
        runtime = ReverseRuntime()
        metrics = RecordingMetrics()
        batcher = await started(runtime, max_batch_size=8, max_delay_ms=0, metrics=metrics)
        futures = batcher.submit(["ab", "boom", "cd"])
        with pytest.raises(BatchError, match="injected failure") as failure:
            await batcher.results(futures)  # the request of a failed item gets its error
        await asyncio.wait(futures)
        others = [f.result() for f in futures if f.exception() is None]
        after = await batcher.infer(["ok"])
        await batcher.stop()
        return failure.value, others, after, metrics

    error, others, after, metrics = run(body())
    assert isinstance(error.__cause__, RuntimeError)
    assert others == [ItemResult("ba"), ItemResult("dc")]  # run apart, they succeed
    assert after == [ItemResult("ko")]
    # [ab, cd, boom] (sorted by length) fails; [ab] succeeds; [cd, boom] fails; [cd], [boom]
    assert metrics.batches == [
        (3, True),
        (1, False),
        (2, True),
        (1, False),
        (1, True),
        (1, False),
    ]


def test_failure_isolation_is_bounded_by_bisection():
    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=64, max_delay_ms=0)
        hold = batcher.submit(["hold"])
        await wait_for_batches(runtime, 1)
        sources = [f"{i:03d}" for i in range(63)] + ["boom"]
        futures = [batcher.submit([s])[0] for s in sources]
        runtime.release()
        await asyncio.wait(hold + futures)
        await batcher.stop()
        return runtime, sources, futures

    runtime, sources, futures = run(body())
    failed = [s for s, f in zip(sources, futures, strict=True) if f.exception() is not None]
    assert failed == ["boom"]
    assert runtime.batch_sizes[1] == 64
    assert len(runtime.batch_sizes) - 2 <= 2 * 6  # 2 log2(64) calls after the failed batch


def test_a_stop_that_cancels_the_bisection_answers_every_item_of_the_batch():
    """A batch fails and its first half is running when the scheduler is cancelled (a stop
    under a timeout, a loop torn down): the second half had left the queue, so nothing
    answered it and its requests waited for ever."""

    async def body():
        runtime = ReverseRuntime(delay=0.3, gated=True)
        batcher = await started(runtime, max_batch_size=4, max_delay_ms=0)
        hold = batcher.submit(["hold"])
        await wait_for_batches(runtime, 1)
        futures = batcher.submit(["b", "c", "d", "boom"])  # halves [b, c] and [d, boom]
        runtime.release()
        await wait_for_batches(runtime, 2)  # the batch of four, then its first half
        batcher._task.cancel()
        done, pending = await asyncio.wait(hold + futures, timeout=5)
        return futures, pending

    futures, pending = run(body())
    assert not pending
    assert all(isinstance(f.exception(), BatcherClosedError) for f in futures)


def test_a_runtime_that_returns_too_few_answers_fails_the_batch():
    class Lossy(ReverseRuntime):
        def predict_batch(self, sources, temperature=None, with_attention=False):
            predictions, attentions = super().predict_batch(sources, temperature, with_attention)
            return predictions[:-1], attentions

    async def body():
        batcher = await started(Lossy(), max_batch_size=8, max_delay_ms=0)
        try:
            # each item run apart gets the batch's fault: 0 predictions for 1 source
            with pytest.raises(BatchError, match="0 predictions for 1 sources"):
                await batcher.infer(["a", "b", "c"])
        finally:
            await batcher.stop()

    run(body())


def test_a_full_queue_refuses_whole_requests_and_recovers():
    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=2, max_delay_ms=0, max_queue=4)
        first = asyncio.ensure_future(batcher.infer(["run"]))
        await wait_for_batches(runtime, 1)
        queued = batcher.submit(["a", "b", "c"])
        with pytest.raises(QueueFullError, match="at most 4"):
            batcher.submit(["d", "e"])  # all or none: "d" does not sneak in
        late = batcher.submit(["d"])
        runtime.release()
        results = [await f for f in [*queued, *late]]
        await first
        await batcher.stop()
        return runtime, results

    runtime, results = run(body())
    assert [r.prediction for r in results] == ["a", "b", "c", "d"]
    assert "e" not in runtime.seen


def test_cancelled_items_are_skipped():
    async def body():
        runtime = ReverseRuntime(gated=True)
        metrics = RecordingMetrics()
        batcher = await started(runtime, max_batch_size=8, max_delay_ms=0, metrics=metrics)
        first = asyncio.ensure_future(batcher.infer(["held"]))
        await wait_for_batches(runtime, 1)
        gone = asyncio.ensure_future(batcher.infer(["gone1", "gone2"]))
        kept = asyncio.ensure_future(batcher.infer(["kept"]))
        await asyncio.sleep(0)
        assert batcher.queue_depth == 3 and metrics.depths[-1] == 3
        gone.cancel()  # the caller leaves: its items are withdrawn
        await asyncio.sleep(0.01)
        # while the worker is still busy, the queue and its gauge no longer count them
        assert batcher.queue_depth == 1 and metrics.depths[-1] == 1
        runtime.release()
        await first
        result = await kept
        await batcher.stop()
        return runtime, gone, result

    runtime, gone, result = run(body())
    assert gone.cancelled()
    assert result == [ItemResult("tpek")]
    assert runtime.seen == ["held", "kept"]


def test_stop_drains_the_queue_then_refuses_new_items():
    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=2, max_delay_ms=60_000)
        pending = asyncio.ensure_future(batcher.infer(["a", "b", "c", "d", "e"]))
        await wait_for_batches(runtime, 1)
        stopping = asyncio.ensure_future(batcher.stop())
        await asyncio.sleep(0)
        assert not batcher.running
        with pytest.raises(BatcherClosedError):
            batcher.submit(["late"])
        runtime.release()
        await stopping
        return await pending

    results = run(body())
    assert [r.prediction for r in results] == ["a", "b", "c", "d", "e"]


def test_stop_without_drain_fails_the_waiting_items():
    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=1, max_delay_ms=0)
        running = asyncio.ensure_future(batcher.infer(["in-flight"]))
        await wait_for_batches(runtime, 1)
        waiting = asyncio.ensure_future(batcher.infer(["waiting"]))
        await asyncio.sleep(0)
        stopping = asyncio.ensure_future(batcher.stop(drain=False))
        await asyncio.sleep(0)
        runtime.release()
        await stopping
        with pytest.raises(BatcherClosedError):
            await waiting
        return await running, runtime

    result, runtime = run(body())
    assert result == [ItemResult("thgilf-ni")]
    assert runtime.seen == ["in-flight"]


def test_metrics_see_every_batch_and_queue_depth_returns_to_zero():
    async def body():
        runtime = ReverseRuntime()
        metrics = RecordingMetrics()
        batcher = await started(runtime, max_batch_size=3, max_delay_ms=0, metrics=metrics)
        await batcher.infer(list("abcdefg"))
        await batcher.stop()
        return runtime, metrics

    runtime, metrics = run(body())
    assert [size for size, _ in metrics.batches] == runtime.batch_sizes
    assert sum(runtime.batch_sizes) == 7
    assert len(metrics.waits) == 7 and min(metrics.waits) >= 0
    assert metrics.depths[-1] == 0


@pytest.mark.parametrize("instances", [1, 3])
def test_random_concurrent_load_gets_exactly_one_correct_answer_per_item(instances):
    rng = random.Random(0)
    requests = [
        ["".join(rng.choices("abcdef", k=rng.randint(0, 12))) for _ in range(rng.randint(1, 5))]
        for _ in range(60)
    ]

    async def client(batcher, sources):
        await asyncio.sleep(rng.random() / 200)
        return await batcher.infer(sources)

    async def body():
        runtime = ReverseRuntime(delay=0.001)
        batcher = await started(runtime, max_batch_size=8, max_delay_ms=1, instances=instances)
        results = await asyncio.gather(*(client(batcher, r) for r in requests))
        await batcher.stop()
        return runtime, results

    runtime, results = run(body())
    for sources, answers in zip(requests, results, strict=True):
        assert [a.prediction for a in answers] == [s[::-1] for s in sources]
    assert sorted(runtime.seen) == sorted(s for r in requests for s in r)
    assert max(runtime.batch_sizes) <= 8
    assert len(runtime.calls) < sum(map(len, requests))  # some batching happened


@pytest.mark.parametrize("instances", [1, 2])
def test_every_caller_gets_an_answer_even_if_the_scheduling_task_dies(instances):
    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=1, max_delay_ms=0, instances=instances)
        in_flight = [asyncio.ensure_future(batcher.infer([f"running {i}"])) for i in range(2)]
        await wait_for_batches(runtime, instances)
        waiting = asyncio.ensure_future(batcher.infer(["waiting"]))
        await asyncio.sleep(0)
        batcher._task.cancel()  # stands for a bug in the scheduling loop
        runtime.release()
        outcomes = await asyncio.gather(*in_flight, waiting, return_exceptions=True)
        return batcher, outcomes

    batcher, outcomes = run(body())
    assert [type(o) for o in outcomes] == [BatcherClosedError] * 3
    assert not batcher.running and batcher.queue_depth == 0


# -- instances: several batches at once --------------------------------------------------------


@pytest.mark.parametrize("instances", [1, 2, 3])
def test_up_to_instances_batches_run_at_once_and_the_next_forms_when_one_ends(instances):
    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=1, max_delay_ms=0, instances=instances)
        sources = [f"item {i}" for i in range(4)]
        requests = [asyncio.ensure_future(batcher.infer([s])) for s in sources]
        inside = await batches_started(runtime, instances)  # all held in the runtime at once
        more = await batches_started(runtime, 1, timeout=0.2)  # no worker free: none forms
        depth = batcher.queue_depth
        runtime.release()
        answers = await asyncio.gather(*requests)
        await batcher.stop()
        return sources, inside, more, depth, answers, runtime

    sources, inside, more, depth, answers, runtime = run(body())
    assert inside and not more
    assert depth == 4 - instances  # the others wait in the queue, not in a worker
    assert answers == [[ItemResult(s[::-1])] for s in sources]
    assert sorted(runtime.seen) == sorted(sources) and runtime.batch_sizes == [1] * 4


def test_stop_lets_every_running_batch_finish_and_drains_the_queue():
    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=1, max_delay_ms=0, instances=2)
        requests = [asyncio.ensure_future(batcher.infer([f"item {i}"])) for i in range(3)]
        await wait_for_batches(runtime, 2)
        stopping = asyncio.ensure_future(batcher.stop(drain=True))
        await asyncio.sleep(0.01)
        refused = None
        try:
            batcher.submit(["late"])
        except BatcherClosedError as exc:
            refused = exc
        runtime.release()
        answers = await asyncio.gather(*requests)
        await stopping
        return batcher, refused, answers

    batcher, refused, answers = run(body())
    assert refused is not None
    assert answers == [[ItemResult(f"item {i}"[::-1])] for i in range(3)]
    assert not batcher.running


def test_with_two_batches_running_terminate_waits_until_neither_has_a_caller():
    """A runtime's terminate ends every call in it: one batch's callers leaving must not end
    the other batch, whose callers still wait."""

    async def body():
        runtime = TerminableRuntime()
        batcher = await started(runtime, max_batch_size=1, max_delay_ms=0, instances=2)
        first = asyncio.ensure_future(batcher.infer(["first"]))
        second = asyncio.ensure_future(batcher.infer(["second"]))
        await wait_for_batches(runtime, 2)
        first.cancel()
        await asyncio.sleep(0.01)
        after_first = runtime.terminations  # the second batch's caller still waits
        second.cancel()
        await asyncio.sleep(0.01)
        after_both = runtime.terminations
        following = await batcher.infer(["next"])  # the runtime serves on
        await batcher.stop()
        return after_first, after_both, following

    after_first, after_both, following = run(body())
    assert (after_first, after_both) == (0, 1)
    assert following == [ItemResult("txen")]


@pytest.mark.parametrize("instances", [1, 2])
def test_a_bug_in_a_batch_ends_the_batcher_at_once_even_with_a_worker_free(instances):
    """With several instances, a batch that hit a bug in the batcher (not in the runtime) went
    unnoticed while a worker was free: the idle batcher still said it was running (ready)."""

    async def body():
        batcher = await started(
            ReverseRuntime(), max_batch_size=1, max_delay_ms=0, instances=instances
        )

        def broken(item, prediction, attention):
            raise RuntimeError("a bug")

        batcher._answer = broken
        with pytest.raises(BatcherClosedError):
            await batcher.infer(["first"])
        await asyncio.wait([batcher._task], timeout=5)
        return batcher

    batcher = run(body())
    assert not batcher.running and batcher._task.done()
    with pytest.raises(RuntimeError, match="a bug"):
        batcher._task.result()


def test_a_second_cancellation_of_the_scheduling_task_still_answers_the_waiting_items():
    """The scheduler, cancelled (a stop under a timeout), waits for its running batches to
    unwind; cancelled again meanwhile (the loop's teardown cancels every task), it left the
    items still queued without an answer."""

    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_batch_size=1, max_delay_ms=0, instances=2)
        in_flight = [asyncio.ensure_future(batcher.infer([f"running {i}"])) for i in range(2)]
        await wait_for_batches(runtime, 2)
        waiting = asyncio.ensure_future(batcher.infer(["waiting"]))
        await asyncio.sleep(0)
        batcher._task.cancel()
        for _ in range(3):  # the scheduler is in its finally, waiting for the running batches
            await asyncio.sleep(0)
        batcher._task.cancel()
        done, pending = await asyncio.wait([*in_flight, waiting], timeout=5)
        runtime.release()
        return [task.exception() for task in done], pending

    errors, pending = run(body())
    assert not pending
    assert [type(error) for error in errors] == [BatcherClosedError] * 3


class SharedFlagRuntime(ReverseRuntime):
    """As ``serving.Runtime``: ``terminate()`` sets one flag for every call in the runtime, which
    each reads at its next onnxruntime run; it is cleared when the last of them ends."""

    def __init__(self) -> None:
        super().__init__(gated=True)
        self.flag = False
        self.terminated: list[list[str]] = []
        self._calls = 0
        self._lock = threading.Lock()

    def terminate(self) -> None:
        with self._lock:
            if self._calls:
                self.flag = True
        self.release()

    def predict_batch(self, sources, temperature=None, with_attention=False):
        with self._lock:
            self._calls += 1
        try:
            answer = super().predict_batch(sources, temperature, with_attention)
            time.sleep(0.2)  # between two runs: the flag is read at the next one
            if self.flag:
                self.terminated.append(list(sources))
                raise RuntimeError("Exiting due to terminate flag being set to true.")
            return answer
        finally:
            with self._lock:
                self._calls -= 1
                if not self._calls:
                    self.flag = False


def test_no_batch_starts_while_a_terminated_one_has_not_ended():
    """With a worker free, the next batch started while the abandoned one had not read the
    runtime's terminate flag yet: the flag, for every call in the runtime, ended it too, and
    its caller got the error."""

    async def body():
        runtime = SharedFlagRuntime()
        metrics = RecordingMetrics()
        batcher = await started(
            runtime, max_batch_size=1, max_delay_ms=0, instances=2, metrics=metrics
        )
        gone = asyncio.ensure_future(batcher.infer(["gone"]))
        await wait_for_batches(runtime, 1)
        gone.cancel()  # its one caller leaves: terminated
        await asyncio.sleep(0)
        following = await batcher.infer(["next"])  # a worker is free: it forms at once
        await batcher.stop()
        return runtime, metrics, following

    runtime, metrics, following = run(body())
    assert runtime.terminated == [["gone"]]
    assert following == [ItemResult("txen")]
    assert metrics.batches == [(1, False), (1, False)]  # terminated, not failed


# -- the policy alone -----------------------------------------------------------------------


def _policy_item(source, request, temperature=None, turn=None):
    from types import SimpleNamespace

    turn = request if turn is None else turn
    return SimpleNamespace(
        source=source, temperature=temperature, maps=None, request=request, turn=turn
    )


def test_choose_batch_leads_with_the_lowest_turn_and_keeps_the_limits():
    from serving.batch_policy import choose_batch

    item = _policy_item
    long_ones = [item("x" * 100, 1, turn=4) for _ in range(5)]  # request 1 led: behind 2 and 3
    short = item("ab", 2)
    warm = item("abc", 3, temperature=0.5)
    pending = [*long_ones, short, warm]
    # Request 2 leads now; one long item fits its 250 padded characters beside it (2 x 100),
    # a second would not (3 x 100); the warm one never joins.
    chosen, remaining = choose_batch(pending, max_batch_size=8, max_batch_chars=250)
    assert chosen == [short, long_ones[0]]
    assert remaining == [*long_ones[1:], warm]  # queue order kept
    # The oldest item of the lowest turn leads; max_batch_size caps the count.
    for one in long_ones:
        one.turn = 1
    chosen, _ = choose_batch(pending, max_batch_size=2, max_batch_chars=10**6)
    assert chosen == long_ones[:2]
    # A lead longer than max_batch_chars still goes, alone.
    chosen, _ = choose_batch(long_ones, max_batch_size=8, max_batch_chars=50)
    assert chosen == [long_ones[0]]


def test_a_long_item_leads_in_its_turn_under_steady_load():
    """An item too long to join others (1,000 characters beside 10-character ones, with
    max_batch_chars 8,192) runs only when it leads. Requests used to take turns after the
    latest lead's request number, so while newer requests kept coming it never led; now a
    request that led goes behind the requests queued then, and the long item leads soon."""

    async def body():
        batcher = await started(ReverseRuntime(), max_batch_size=64, max_delay_ms=60_000)
        batcher.submit(["s" * 10, "L" * 1000])
        for _ in range(10):
            batcher.submit(["z" * 10])
        long_item = batcher._pending[1]
        taken = []  # batches taken by hand, between which ten requests arrive each time
        while len(taken) < 50 and long_item not in (taken[-1] if taken else []):
            taken.append(batcher._take_batch())
            for _ in range(10):
                batcher.submit(["z" * 10])
        batcher._pending.clear()
        await batcher.stop()
        return long_item, taken

    long_item, taken = run(body())
    assert long_item in taken[-1], "the long item was still queued after 50 batches"
    assert len(taken) <= 12  # behind at most the 11 requests queued before its own turn
    assert all(long_item not in batch for batch in taken[:-1])


class TerminableRuntime(ReverseRuntime):
    """A gated runtime whose call in progress ends, raising as onnxruntime's runs do, when
    ``terminate()`` is called (``serving.load``'s runtimes have it)."""

    def __init__(self) -> None:
        super().__init__(gated=True)
        self.terminations = 0
        self._terminated = threading.Event()

    def terminate(self) -> None:
        self.terminations += 1
        self._terminated.set()
        self.release()

    def predict_batch(self, sources, temperature=None, with_attention=False):
        terminated = self._terminated
        answer = super().predict_batch(sources, temperature, with_attention)
        if terminated.is_set():
            self._terminated = threading.Event()  # the next call runs as usual
            raise RuntimeError("Exiting due to terminate flag being set to true.")
        return answer


def test_a_batch_no_one_waits_for_is_terminated_and_the_next_one_runs():
    """A runtime call went on to its end after every caller of its batch had left: a long
    search held the model (and the server's shutdown) for as long as it took."""

    async def body():
        runtime = TerminableRuntime()
        metrics = RecordingMetrics()
        batcher = await started(runtime, max_batch_size=8, max_delay_ms=0, metrics=metrics)
        both = asyncio.ensure_future(batcher.infer(["long"]))
        await wait_for_batches(runtime, 1)  # "long" runs alone
        partly = asyncio.ensure_future(batcher.infer(["kept", "gone"]))
        await asyncio.sleep(0.01)
        assert runtime.terminations == 0
        both.cancel()
        await asyncio.sleep(0.01)
        assert runtime.terminations == 1  # its one caller left: ended
        result = await partly  # the next batch runs as usual
        following = asyncio.ensure_future(batcher.infer(["next"]))
        await asyncio.sleep(0.01)
        await batcher.stop()
        return runtime, metrics, result, await following

    runtime, metrics, result, following = run(body())
    assert result == [ItemResult("tpek"), ItemResult("enog")]
    assert following == [ItemResult("txen")]
    assert runtime.terminations == 1
    # the terminated call, counted as a batch and not as a failure (a client's timeout would
    # have fired an alert on the model's failures); nothing failed
    assert metrics.batches[0] == (1, False)
    assert all(not failed for _, failed in metrics.batches)


def test_a_batch_abandoned_while_it_waited_for_a_shared_thread_never_runs():
    """Two models on one inference thread: a batch queued behind the other model's, whose
    callers all left meanwhile, ran in full when the thread came free (terminate reaches calls
    in progress only)."""
    from concurrent.futures import ThreadPoolExecutor

    async def body():
        executor = ThreadPoolExecutor(1)
        busy, idle = ReverseRuntime(gated=True), ReverseRuntime()
        metrics = RecordingMetrics()
        first = await started(busy, max_delay_ms=0, executor=executor)
        second = await started(idle, max_delay_ms=0, executor=executor, metrics=metrics)
        holding = asyncio.ensure_future(first.infer(["hold"]))
        await wait_for_batches(busy, 1)  # the one thread is taken
        gone = asyncio.ensure_future(second.infer(["gone"]))
        await asyncio.sleep(0.05)  # its batch formed, and waits for the thread
        gone.cancel()
        await asyncio.sleep(0.01)
        busy.release()
        held = await holding
        following = await second.infer(["next"])  # the next batch runs as usual
        await first.stop()
        await second.stop()
        executor.shutdown()
        return idle, metrics, held, following

    idle, metrics, held, following = run(body())
    assert held == [ItemResult("dloh")] and following == [ItemResult("txen")]
    assert [call[0] for call in idle.calls] == [["next"]]  # "gone" never reached the runtime
    assert metrics.batches == [(1, False), (1, False)]  # and is not counted as a failure


async def behind_another_models_batch(make_batcher, sources: list[str]):
    """Two models on one inference thread, as the server runs them (``workers`` shared): a
    batch of another model holds the thread while ``sources`` arrive, 0.3 s apart, at the
    batcher ``make_batcher(executor, metrics)``; then the thread comes free. Returns that
    batcher's metrics, the other model's answer and the answers to ``sources``."""
    from concurrent.futures import ThreadPoolExecutor

    executor, workers = ThreadPoolExecutor(1), asyncio.Semaphore(1)
    busy, metrics = ReverseRuntime(gated=True), RecordingMetrics()
    first = Batcher(busy, max_delay_ms=0, executor=executor)
    second = make_batcher(executor, metrics)
    await first.start(workers)
    await second.start(workers)
    holding = asyncio.ensure_future(first.infer(["hold"]))
    await wait_for_batches(busy, 1)  # the one thread is taken
    waiting = []
    for source in sources:
        waiting.append(asyncio.ensure_future(second.infer([source])))
        await asyncio.sleep(0.3)
    busy.release()
    held = await holding
    answers = [await future for future in waiting]
    await first.stop()
    await second.stop()
    executor.shutdown()
    return metrics, held, answers


async def worker_after_a_cancel_mid_call(batcher, begun, release) -> tuple:
    """Start ``batcher`` on a worker of its own (and two threads), cancel its scheduling task
    (a stop cut short at shutdown) once ``begun()`` says its call runs, then ``release()`` the
    call. Returns whether the worker was held after the cancel, whether it still was once the
    call ended, and the waiting request's error."""
    from concurrent.futures import ThreadPoolExecutor

    workers = asyncio.Semaphore(1)
    batcher._executor = executor = ThreadPoolExecutor(2)
    await batcher.start(workers)
    waiting = asyncio.ensure_future(batcher.infer(["12"]))
    await begun()
    batcher._task.cancel()
    await asyncio.wait([batcher._task, waiting], timeout=5)
    held_while_running = workers.locked()
    release()
    for _ in range(500):  # the call ends in its thread, then frees the worker
        if not workers.locked():
            break
        await asyncio.sleep(0.01)
    executor.shutdown()
    return held_while_running, workers.locked(), type(waiting.exception())


def test_a_batch_cancelled_mid_call_frees_its_worker_when_the_call_ends():
    """The thread of a call that a cancelled batch leaves running is not free before the call
    ends: the batchers sharing the workers must not start another call on it meanwhile (the
    worker was freed with the task)."""
    runtime = ReverseRuntime(gated=True)
    batcher = Batcher(runtime, max_delay_ms=0)
    held = run(
        worker_after_a_cancel_mid_call(
            batcher, lambda: wait_for_batches(runtime, 1), runtime.release
        )
    )
    assert held == (True, False, BatcherClosedError)


def test_batchers_sharing_a_thread_form_their_batch_when_it_is_free():
    """A batch forms only once the shared thread is free, so the items that arrived while the
    other model's batch ran join it, and their queue wait, not the batch's inference time,
    holds the time they waited for the thread (it was the other way round: the batch formed
    at once, then waited in the executor's queue)."""
    idle = ReverseRuntime()

    def make_batcher(executor, metrics):
        return Batcher(idle, max_delay_ms=0, executor=executor, metrics=metrics)

    metrics, held, answers = run(behind_another_models_batch(make_batcher, ["ab", "cd"]))
    assert held == [ItemResult("dloh")]
    assert answers == [[ItemResult("ba")], [ItemResult("dc")]]
    assert idle.batch_sizes == [2]  # both waited for the thread, and ran as one batch
    assert min(metrics.waits) >= 0.3  # each waited while the thread ran the other model
    assert metrics.seconds[0] < min(metrics.waits)  # the batch's own time, without the wait


def test_an_eager_batch_due_while_the_worker_was_busy_waits_for_a_read_begun_meanwhile():
    """The eager rule holds when the worker comes free: an item that became due while the
    worker was busy waits (up to max_delay) for a request whose read began meanwhile, rather
    than leaving in a batch of its own because it was due when the wait for the worker began."""

    async def body():
        runtime = ReverseRuntime(gated=True)
        batcher = await started(runtime, max_delay_ms=500, eager=True)
        first = batcher.submit(["a1"])  # runs at once, held at the gate
        await wait_for_batches(runtime, 1)
        second = batcher.submit(["b2"])  # due (no read), but the worker is busy
        await asyncio.sleep(0.02)
        with batcher.receiving():  # a request is being read as the worker comes free
            await asyncio.sleep(0.02)
            runtime.release()
            await asyncio.sleep(0.1)
            third = batcher.submit(["c3"])
        await batcher.results(first + second + third)
        await batcher.stop()
        return runtime

    assert run(body()).batch_sizes == [1, 2]


def test_a_batcher_runs_at_most_its_instances_whatever_workers_it_shares():
    """``instances`` bounds a batcher's batches in the runtime (one, for a runtime with IO
    binding) even when it shares more free threads with others."""
    from concurrent.futures import ThreadPoolExecutor

    async def body():
        executor, runtime = ThreadPoolExecutor(2), ReverseRuntime(gated=True)
        batcher = Batcher(runtime, max_delay_ms=0, max_batch_size=1, executor=executor)
        await batcher.start(asyncio.Semaphore(2))
        futures = batcher.submit(["a"]) + batcher.submit(["b"])
        await wait_for_batches(runtime, 1)
        second_started = await batches_started(runtime, 1, timeout=0.3)
        runtime.release()
        answers = await batcher.results(futures)
        await batcher.stop()
        executor.shutdown()
        return second_started, answers

    second_started, answers = run(body())
    assert not second_started  # the second batch waited for the first (instances=1)
    assert answers == [ItemResult("a"), ItemResult("b")]


def test_hurry_runs_the_queue_without_waiting_out_the_delay():
    """The server calls hurry() as it begins shutting down: an item queued under a minute's
    delay (not eager) runs at once rather than outlasting the shutdown's timeout."""

    async def body():
        runtime = ReverseRuntime()
        batcher = await started(runtime, max_delay_ms=60_000)
        futures = batcher.submit(["abc", "de"])
        await asyncio.sleep(0.05)
        assert runtime.calls == []  # waiting for more items, up to a minute
        batcher.hurry()
        answers = await asyncio.wait_for(batcher.results(futures), timeout=10)
        late = await asyncio.wait_for(batcher.infer(["f"]), timeout=10)  # and from then on
        await batcher.stop()
        return runtime, answers, late

    runtime, answers, late = run(body())
    assert answers == [ItemResult("cba"), ItemResult("ed")]
    assert late == [ItemResult("f")]
    assert runtime.batch_sizes == [2, 1]


def test_a_failure_after_every_caller_left_still_counts_as_a_failure():
    """Only a batch terminate() ended, or one that never started, is not a failure: a model
    that fails slowly (out of memory on a large batch) after its clients timed out is."""

    async def body():
        runtime = ReverseRuntime(gated=True)  # no terminate(): nothing ends it early
        metrics = RecordingMetrics()
        batcher = await started(runtime, max_delay_ms=0, metrics=metrics)
        gone = asyncio.ensure_future(batcher.infer([f"a{FAIL_MARKER}"]))
        await wait_for_batches(runtime, 1)
        gone.cancel()
        await asyncio.sleep(0.01)
        runtime.release()  # it fails, with no one waiting
        following = await batcher.infer(["next"])
        await batcher.stop()
        return metrics, following

    metrics, following = run(body())
    assert following == [ItemResult("txen")]
    assert metrics.batches == [(1, True), (1, False)]


def test_a_batch_someone_still_waits_for_is_not_terminated():
    async def body():
        runtime = TerminableRuntime()
        batcher = await started(runtime, max_batch_size=8, max_delay_ms=0)
        gone = asyncio.ensure_future(batcher.infer(["gone"]))
        kept = asyncio.ensure_future(batcher.infer(["kept"]))
        await asyncio.sleep(0)
        await wait_for_batches(runtime, 1)  # both in one batch
        gone.cancel()
        await asyncio.sleep(0.01)
        runtime.release()
        result = await kept
        await batcher.stop()
        return runtime, result

    runtime, result = run(body())
    assert runtime.terminations == 0
    assert result == [ItemResult("tpek")]

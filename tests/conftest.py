"""Shared fixtures: a small digit-reversal task and a model fitted on it once per session, and
a running server for the server-side tests."""

import contextlib
import logging

import pytest
import torch

from skattn.datasets import make_reversal

# The test machines have two cores shared by parallel jobs; tiny modules run many times faster
# on one intra-op thread than on two contended ones. This covers torch code run directly (the
# modules, the reference checks); the estimator sets torch's threads to its own n_threads for
# each fit and prediction (default: the usable cores), which its tests check.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def reversal_data():
    """``(X_train, y_train, X_test, y_test)``: 500 training and 200 held-out digit strings of
    length 3 to 6 and their reversals."""
    X_train, y_train = make_reversal(500, min_length=3, max_length=6, random_state=0)
    X_test, y_test = make_reversal(200, min_length=3, max_length=6, random_state=1)
    return X_train, y_train, X_test, y_test


REVERSAL_PARAMS = dict(
    embedding_dim=16,
    hidden_size=48,
    batch_size=32,
    learning_rate=3e-3,
    max_epochs=20,
    n_iter_no_change=4,
    device="cpu",
    random_state=0,
)


@pytest.fixture(scope="session")
def fitted_reversal(reversal_data):
    """A Bahdanau / additive ``Seq2Seq`` fitted on ``reversal_data`` (a few seconds on CPU).

    Shared by several test modules: do not modify it (``clone`` it or ``copy.deepcopy`` first).
    """
    from skattn import Seq2Seq

    X_train, y_train, _, _ = reversal_data
    return Seq2Seq(**REVERSAL_PARAMS).fit(X_train, y_train)


@pytest.fixture
def serve():
    """serve(runtime=None, limits=None, http_impl="auto", **settings) -> a running server
    (``test_server.RunningServer``, on 127.0.0.1); stopped after the test."""
    from serving_doubles import ReverseRuntime
    from test_server import RunningServer

    from serving.settings import ServerSettings

    with contextlib.ExitStack() as stack:

        def start(runtime=None, limits=None, http_impl="auto", **settings):
            runtime = ReverseRuntime() if runtime is None else runtime
            server = RunningServer(runtime, ServerSettings(**settings), limits, http_impl)
            return stack.enter_context(server)

        yield start


@pytest.fixture
def keep_logging():
    """``serving.__main__.main`` sends logs to stderr as JSON lines, through a handler on the
    root logger that would outlive the test (and write to its closed capture); give the test
    process its handlers back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)

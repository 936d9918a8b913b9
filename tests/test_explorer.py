"""The attention explorer page, driven in a real headless Chromium (Selenium + chromedriver).

The page is served by the real server (``create_app`` + ``mount_explorer``) in uvicorn on a
thread. Most tests use deterministic runtimes whose attention follows a fixed formula
(``reverse_attention``), so every cell, recipe and temperature effect is checked exactly; one
test serves two small models trained with ``Seq2Seq`` and exported with ``export_onnx``.

Screenshots go to ``$SKATTN_ARTIFACTS`` (default: the test's ``tmp_path``). The README's
``docs/explorer.png`` shows well-trained models, so ``examples/explorer.py --screenshot`` makes
it (minutes of training, too long for a test). The browser tests are skipped, with the reason,
only where ``/usr/bin/chromium`` is absent (CI installs it).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from serving_doubles import check_source

from serving.app import ServerSettings, create_app
from serving.explorer import STATIC_DIR, model_summary, mount_explorer
from serving.interface import ModelInfo, vocabulary_id

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 20.0
REAL_MODEL_STEPS = 60  # seconds of CPU: checks the plumbing, not the accuracy


# ---------------------------------------------------------------------------------------------
# Deterministic runtimes (the runtime interface of docs/internals.md)


def reverse_attention(source: str, temperature: float) -> np.ndarray:
    """Step i attends around source position T_x - 2 - i: softmax(-|j - target_i| / tau).

    ``(T_y, T_x)`` with ``T_y = len(source)`` output tokens and ``T_x = len(source) + 1``.
    """
    t_y, t_x = len(source), len(source) + 1
    target = (t_x - 2 - np.arange(t_y))[:, None]  # (T_y, 1)
    scores = -np.abs(np.arange(t_x)[None, :] - target) / temperature  # (T_y, T_x)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def final_state_attention(source: str, n_out: int) -> np.ndarray:
    """No attention: every row one-hot on the last column (the final encoder state)."""
    weights = np.zeros((n_out, len(source) + 1), dtype=np.float32)  # (T_y, T_x)
    weights[:, -1] = 1.0
    return weights


class FakeRuntime:
    """Reverses a string (``attention="global"``) or drops its last character (``"none"``)."""

    provider = "CPUExecutionProvider"

    def __init__(
        self,
        name: str,
        attention: str = "global",
        temperature: float = 1.0,
        max_source_length: int = 12,
        vocabulary: str = "abcdefghx",
        output_kind: str = "str",
    ) -> None:
        self.name = name
        self.max_source_length = max_source_length
        self.manifest = {
            "format_version": 1,
            "decoder": "bahdanau",
            "attention": attention,
            "scorer": "additive",
            "tokenizer": "char",
            "temperature": temperature,
            "output_kind": output_kind,
            "source_vocabulary": ["<pad>", "<s>", "</s>", "<unk>", *vocabulary],
            "target_vocabulary": ["<pad>", "<s>", "</s>", "<unk>", *vocabulary],
        }
        self.gate = threading.Event()
        self.gate.set()
        self.temperatures: list[float | None] = []

    @property
    def info(self) -> ModelInfo:
        manifest = self.manifest
        return ModelInfo(
            name=self.name,
            provider=self.provider,
            max_source_length=self.max_source_length,
            max_output_length=self.max_source_length,
            output_kind=manifest["output_kind"],
            tokenizer=manifest["tokenizer"],
            decoder=manifest["decoder"],
            attention=manifest["attention"],
            scorer=manifest["scorer"],
            beam_size=1,
            temperature=float(manifest["temperature"]),
            vocabulary_id=vocabulary_id(
                manifest["source_vocabulary"], manifest["target_vocabulary"]
            ),
            warmup_source="x",
        )

    def check_source(self, text: object) -> None:
        check_source(text, self.max_source_length)

    def answer(self, source: str) -> str | list[str]:
        answer = source[::-1] if self.manifest["attention"] != "none" else source[::-1][:-1]
        return list(answer) if self.manifest["output_kind"] == "tokens" else answer

    def attention(self, source: str, temperature: float | None) -> np.ndarray:
        if self.manifest["attention"] == "none":
            return final_state_attention(source, len(self.answer(source)))
        tau = self.manifest["temperature"] if temperature is None else temperature
        return reverse_attention(source, tau)

    def predict_batch(
        self, sources: list[str], temperature: float | None = None, with_attention: bool = False
    ) -> tuple[list[str], list[np.ndarray] | None]:
        if list(sources) == [self.info.warmup_source]:  # the start-up call is never held
            return [self.answer(sources[0])], [self.attention(sources[0], temperature)]
        if not self.gate.wait(timeout=30):
            raise RuntimeError("the test never opened the gate")
        self.temperatures.append(temperature)
        predictions = [self.answer(s) for s in sources]
        if not with_attention:
            return predictions, None
        return predictions, [self.attention(s, temperature) for s in sources]

    def predict(self, sources: list[str], temperature: float | None = None) -> list[str]:
        return self.predict_batch(sources, temperature)[0]

    def predict_attention(
        self, sources: list[str], temperature: float | None = None
    ) -> list[np.ndarray]:
        return self.predict_batch(sources, temperature, with_attention=True)[1]


# ---------------------------------------------------------------------------------------------
# The server on a thread, on a port of its own


def explorer_app(runtimes: dict, settings: ServerSettings | None = None) -> FastAPI:
    """The server as ``python -m serving`` builds it, with the explorer mounted."""
    app = create_app(runtimes, settings)
    mount_explorer(app, runtimes)
    return app


class ThreadedServer:
    """An app served by uvicorn on a thread, on 127.0.0.1:<a free port>."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", access_log=False)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + WAIT_S
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=WAIT_S)
        self._socket.close()


def infer_json(url: str, model: str, source: str, temperature: float | None = None) -> dict:
    """The server's own answer for one source, attention included, as the page asks for it."""
    body: dict = {
        "inputs": [{"name": "source", "datatype": "BYTES", "shape": [1], "data": [source]}],
        "outputs": [{"name": "prediction"}, {"name": "attention"}, {"name": "attention_lengths"}],
    }
    if temperature is not None:
        body["parameters"] = {"temperature": temperature}
    response = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=WAIT_S)
    response.raise_for_status()
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    t_y, t_x = outputs["attention_lengths"]["data"]
    padded = np.asarray(outputs["attention"]["data"], dtype=np.float64).reshape(
        outputs["attention"]["shape"]
    )  # (1, T_y max, T_x max)
    return {"prediction": outputs["prediction"]["data"][0], "weights": padded[0, :t_y, :t_x]}


# ---------------------------------------------------------------------------------------------
# The listing and the page's files (no browser needed)


@pytest.fixture(scope="module")
def fake_runtimes() -> dict[str, FakeRuntime]:
    return {
        "reverse": FakeRuntime("reverse", temperature=1.0),
        "reverse-none": FakeRuntime("reverse-none", attention="none"),
    }


@pytest.fixture(scope="module")
def fake_server(fake_runtimes: dict) -> Iterator[ThreadedServer]:
    with ThreadedServer(explorer_app(fake_runtimes)) as server:
        yield server


def test_mount_explorer_twice_is_a_no_op(fake_runtimes: dict) -> None:
    app = explorer_app(fake_runtimes)
    routes = [getattr(route, "path", None) for route in app.routes]
    mount_explorer(app, fake_runtimes)  # create_app may already have called it
    assert [getattr(route, "path", None) for route in app.routes] == routes
    assert routes.count("/") == 1 and routes.count("/v2/models") == 1


def test_models_listing_describes_every_model(fake_server: ThreadedServer) -> None:
    with httpx.Client(base_url=fake_server.url, timeout=WAIT_S) as client:
        listing = client.get("/v2/models")
        assert listing.status_code == 200
        models = listing.json()
        # the model-metadata route of the protocol still answers beside the listing
        assert client.get("/v2/models/reverse").json()["name"] == "reverse"
    common = {
        "ready": True,
        "decoder": "bahdanau",
        "scorer": "additive",
        "tokenizer": "char",
        "temperature": 1.0,
        "output_kind": "str",
        "max_source_length": 12,
        "attention_layers": 0,
        "attention_heads": 0,
        "source_tokens": [],  # the doubles do not say: the page shows tokens as typed
    }
    vocabulary_id = models[0]["vocabulary_id"]
    assert models == [
        {"name": "reverse", "attention": "global", "vocabulary_id": vocabulary_id, **common},
        {"name": "reverse-none", "attention": "none", "vocabulary_id": vocabulary_id, **common},
    ]
    assert len(vocabulary_id) == 16 and int(vocabulary_id, 16) >= 0


def test_model_summary_tells_tasks_apart() -> None:
    same = [model_summary("m", FakeRuntime("m", vocabulary=v).info, True) for v in ("abc", "abc")]
    other = model_summary("m", FakeRuntime("m", vocabulary="abd").info, True)
    assert same[0]["vocabulary_id"] == same[1]["vocabulary_id"] != other["vocabulary_id"]
    summary = model_summary("plain", FakeRuntime("m", attention="none").info, False)
    assert summary == {
        "name": "plain",
        "ready": False,
        "decoder": "bahdanau",
        "attention": "none",
        "scorer": "additive",
        "tokenizer": "char",
        "temperature": 1.0,
        "output_kind": "str",
        "max_source_length": 12,
        "vocabulary_id": FakeRuntime("m").info.vocabulary_id,
        "attention_layers": 0,
        "attention_heads": 0,
        "source_tokens": [],
    }


def test_page_and_static_files_are_served_without_outside_references(fake_runtimes) -> None:
    app = FastAPI()
    mount_explorer(app, fake_runtimes, is_ready=lambda name: name != "reverse-none")
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        for name in ("explorer.js", "explorer.css"):
            response = client.get(f"/static/{name}")
            assert response.status_code == 200
            assert response.text == (STATIC_DIR / name).read_text(encoding="utf-8")
            # revalidated on every load: an upgraded server's page never runs an older script
            assert response.headers["cache-control"] == "no-cache"
            assert response.headers["x-content-type-options"] == "nosniff"
        assert client.get("/static/missing.js").status_code == 404
        # Range is ignored (Starlette would answer a bad one in plain text): the whole file
        for path in ("/", "/static/explorer.css"):
            for bad_range in ("bytes=abc", "bytes=5-1", "items=0-1", "bytes=999999-", "bytes=0-3"):
                response = client.get(path, headers={"Range": bad_range})
                assert response.status_code == 200, (path, bad_range)
                assert response.content == client.get(path).content
                assert "accept-ranges" not in response.headers
        ready = {m["name"]: m["ready"] for m in client.get("/v2/models").json()}
        assert ready == {"reverse": True, "reverse-none": False}
    for path in STATIC_DIR.iterdir():  # nothing fetched from elsewhere at run time
        text = path.read_text(encoding="utf-8")
        assert "http://" not in text and "https://" not in text, path.name


@pytest.mark.parametrize("runtimes", [{}, [("a", object())], None])
def test_mount_explorer_rejects_bad_runtimes(runtimes: object) -> None:
    with pytest.raises(ValueError, match="runtimes"):
        mount_explorer(FastAPI(), runtimes)


# ---------------------------------------------------------------------------------------------
# The browser


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tmp_path_factory.mktemp("chromium-profile")  # a fresh --user-data-dir
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    directory = Path(os.environ.get("SKATTN_ARTIFACTS") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


class Page:
    """The explorer in the browser, read through the data attributes it puts on its cells."""

    def __init__(self, driver, url: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver = driver
        self.by = By
        driver.get_log("browser")  # drop the messages of earlier pages
        driver.get(url)
        self.wait_until(lambda: self.attr("#explorer", "data-state") == "idle")

    def wait_until(self, condition: Callable[[], object], what: str = "the page") -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(self.driver, WAIT_S, poll_frequency=0.05).until(
            lambda _: condition(), message=f"timed out waiting for {what}"
        )

    def find(self, css: str):
        return self.driver.find_element(self.by.CSS_SELECTOR, css)

    def attr(self, css: str, name: str) -> str | None:
        return self.find(css).get_attribute(name)

    def updates(self, panel: str) -> int:
        return int(self.attr(f"#panel-{panel}", "data-updates"))

    def after_update(self, action: Callable[[], None], panel: str = "main") -> None:
        """Do ``action`` and wait until ``panel`` has drawn its answer."""
        before = self.updates(panel)
        action()
        self.wait_until(
            lambda: self.updates(panel) > before and self.attr("#explorer", "data-state") == "idle",
            f"panel {panel} to redraw",
        )

    def heatmap(self, panel: str = "main") -> np.ndarray:
        """The weights in the cells' data attributes, placed by their data-row / data-col."""
        cells = self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map("
            "c => [Number(c.dataset.row), Number(c.dataset.col), Number(c.dataset.weight)]);",
            f"#panel-{panel} td.cell",
        )
        if not cells:
            return np.zeros((0, 0))
        cells = np.asarray(cells)
        t_y, t_x = int(cells[:, 0].max()) + 1, int(cells[:, 1].max()) + 1
        weights = np.full((t_y, t_x), np.nan)
        weights[cells[:, 0].astype(int), cells[:, 1].astype(int)] = cells[:, 2]
        return weights

    def texts(self, css: str) -> list[str]:
        return self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent);",
            css,
        )

    def translate(self, text: str) -> None:
        from selenium.webdriver.common.keys import Keys

        def type_it() -> None:
            field = self.find("#source")
            field.clear()
            field.send_keys(text + Keys.ENTER)

        self.after_update(type_it)

    def slide_temperature(self, key: str) -> None:
        from selenium.webdriver.common.keys import Keys

        self.after_update(lambda: self.find("#temperature").send_keys(getattr(Keys, key)))

    def severe_console_messages(self) -> list[str]:
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]


def test_explorer_heatmap_recipe_temperature_and_comparison(
    browser, fake_server: ThreadedServer, artifacts: Path
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    page = Page(browser, fake_server.url + "/")
    assert [
        o.get_attribute("value")
        for o in page.driver.find_elements(page.by.CSS_SELECTOR, "#model option")
    ] == ["reverse", "reverse-none"]
    assert page.find("#model").get_attribute("value") == "reverse"
    assert page.find("#temperature-value").text == "τ = 1.0"

    # type an input: one row per output token, cells equal to the server's attention output
    source = "abcdefg"
    page.translate(source)
    expected = infer_json(fake_server.url, "reverse", source, temperature=1.0)
    assert page.find("#panel-main .prediction").text == expected["prediction"] == "gfedcba"
    shown = page.heatmap()
    assert shown.shape == (len("gfedcba"), len(source) + 1)
    np.testing.assert_allclose(shown, expected["weights"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(shown, reverse_attention(source, 1.0), rtol=1e-6, atol=1e-7)
    assert page.texts("#panel-main thead th[data-col]") == [*source, "</s>"]
    assert page.texts("#panel-main tbody th") == list("gfedcba")
    assert page.attr("#panel-main", "data-rows") == "7"
    assert page.find("#error").get_attribute("hidden") is not None
    browser.save_screenshot(str(artifacts / "explorer-heatmap.png"))

    # hover a cell: its value is read out
    cell = page.find('#panel-main td.cell[data-row="1"][data-col="5"]')
    ActionChains(browser).move_to_element(cell).perform()
    page.wait_until(lambda: "0." in page.find("#panel-main .readout").text, "the hover readout")
    readout = page.find("#panel-main .readout").text
    assert f"{shown[1, 5]:.4f}" in readout and '"f"' in readout and "step 2" in readout

    # click a row: its recipe lists every source position, largest weight first
    page.find('#panel-main tbody tr[data-row="2"] th').click()
    page.wait_until(lambda: page.texts("#panel-main .recipe h3"), "the recipe")
    assert page.texts("#panel-main .recipe h3") == ['Step 3: output "e"']
    assert page.attr('#panel-main tbody tr[data-row="2"]', "aria-selected") == "true"
    items = browser.execute_script(
        "return Array.from(document.querySelectorAll('#panel-main .recipe li')).map("
        "li => [Number(li.dataset.col), Number(li.dataset.weight)]);"
    )
    cols = [int(col) for col, _ in items]
    recipe_weights = np.array([w for _, w in items])
    assert sorted(cols) == list(range(len(source) + 1))
    assert np.all(np.diff(recipe_weights) <= 0)
    np.testing.assert_allclose(recipe_weights, shown[2, cols], rtol=1e-6)
    assert cols[0] == len(source) - 1 - 2  # step i reads source position T_x - 2 - i most
    context = page.find("#panel-main .recipe .context").text
    assert context.startswith("c₃ = Σⱼ α₃ⱼ hⱼ = ")
    assert f"{recipe_weights[0]:.3f}·h₅" in context  # source position 5 is h₅ (1-based)
    browser.save_screenshot(str(artifacts / "explorer-recipe.png"))

    # temperature to its extremes: near one-hot, then near uniform; the recipe follows
    page.slide_temperature("HOME")
    assert page.find("#temperature-value").text == "τ = 0.05"
    cold = page.heatmap()
    np.testing.assert_allclose(cold, reverse_attention(source, 0.05), rtol=1e-5, atol=1e-7)
    assert np.all(cold.max(axis=1) > 0.99)
    assert page.texts("#panel-main .recipe h3") == ['Step 3: output "e"']  # still selected
    assert float(page.attr("#panel-main .recipe li", "data-weight")) == pytest.approx(
        cold[2].max(), rel=1e-6
    )
    page.slide_temperature("END")
    assert page.find("#temperature-value").text == "τ = 20"
    hot = page.heatmap()
    np.testing.assert_allclose(hot, reverse_attention(source, 20.0), rtol=1e-5, atol=1e-7)
    uniform = 1 / hot.shape[1]
    assert np.all(np.abs(hot - uniform) < 0.25 * uniform)
    browser.save_screenshot(str(artifacts / "explorer-hot.png"))
    assert fake_server.app.state.models["reverse"].runtime.temperatures[-1] == pytest.approx(20.0)

    # the no-attention model side by side: every row on the final encoder state
    page.find("#temperature-reset").click()
    page.wait_until(lambda: page.find("#temperature-value").text == "τ = 1.0", "the reset")
    assert page.find("#panel-compare").get_attribute("hidden") is not None
    page.after_update(lambda: page.find("#compare").click(), panel="compare")
    assert page.find("#panel-compare").is_displayed()
    assert page.find("#panel-compare .prediction").text == "gfedcb"
    bare = page.heatmap("compare")
    np.testing.assert_array_equal(bare, final_state_attention(source, len("gfedcb")))
    np.testing.assert_allclose(page.heatmap("main"), reverse_attention(source, 1.0), rtol=1e-6)
    assert "final encoder state" in page.find("#panel-compare .note").text
    browser.save_screenshot(str(artifacts / "explorer-compare.png"))
    page.after_update(lambda: page.find("#compare").click())
    assert not page.find("#panel-compare").is_displayed()

    assert page.severe_console_messages() == []


def test_explorer_reads_url_parameters_and_keys(browser, fake_server: ThreadedServer) -> None:
    from selenium.webdriver.common.keys import Keys

    # a temperature outside the slider's range is sent as it is, not clamped to 0.05
    page = Page(browser, fake_server.url + "/?model=reverse&source=abcd&temperature=0.001")
    assert page.find("#temperature-value").text == "τ = 1.0e-3"
    assert fake_server.app.state.models["reverse"].runtime.temperatures[-1] == 0.001
    page = Page(browser, fake_server.url + "/?model=reverse&source=abcd&temperature=0.5")
    assert page.find("#model").get_attribute("value") == "reverse"
    assert page.find("#temperature-value").text == "τ = 0.50"
    assert fake_server.app.state.models["reverse"].runtime.temperatures[-1] == 0.5
    np.testing.assert_allclose(page.heatmap(), reverse_attention("abcd", 0.5), rtol=1e-6)

    # the keyboard reaches the rows: Enter selects, arrows move the selection
    page.find('#panel-main tbody tr[data-row="0"]').send_keys(Keys.ENTER)
    page.wait_until(lambda: page.texts("#panel-main .recipe h3") == ['Step 1: output "d"'])
    page.find('#panel-main tbody tr[data-row="0"]').send_keys(Keys.ARROW_DOWN)
    page.wait_until(lambda: page.texts("#panel-main .recipe h3") == ['Step 2: output "c"'])
    assert page.attr('#panel-main tbody tr[data-row="1"]', "aria-selected") == "true"

    # a model without attention has no partner to compare with
    page = Page(browser, fake_server.url + "/?model=reverse-none&source=ab")
    assert not page.find("#compare-field").is_displayed()
    assert page.find("#panel-main .prediction").text == "b"
    np.testing.assert_array_equal(page.heatmap(), final_state_attention("ab", 1))


def test_dragging_the_slider_ends_on_the_last_temperature(
    browser, fake_server: ThreadedServer
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    page = Page(browser, fake_server.url + "/?model=reverse&source=abcde")
    drag = ActionChains(browser).click_and_hold(page.find("#temperature"))
    for _ in range(12):  # many input events while queries are in flight
        drag.move_by_offset(-8, 0)
    drag.release().perform()
    page.wait_until(lambda: page.attr("#explorer", "data-state") == "idle", "the last query")
    tau = browser.execute_script("return window.skattnExplorer.temperature;")
    assert 0.05 <= tau < 0.5
    assert fake_server.app.state.models["reverse"].runtime.temperatures[-1] == pytest.approx(tau)
    np.testing.assert_allclose(page.heatmap(), reverse_attention("abcde", tau), rtol=1e-5)


def test_no_attention_partner_only_for_the_same_task(browser) -> None:
    from selenium.webdriver.support.ui import Select

    runtimes = {
        "g2p": FakeRuntime("g2p", vocabulary="abcHAE", output_kind="tokens"),
        "reverse": FakeRuntime("reverse"),
        "reverse-none": FakeRuntime("reverse-none", attention="none"),
        "other-none": FakeRuntime("other-none", attention="none", vocabulary="xyz"),
        "other-task": FakeRuntime("other-task", vocabulary="pqr"),
    }
    with ThreadedServer(explorer_app(runtimes)) as server:
        page = Page(browser, server.url + "/?model=g2p&source=cab")
        assert not page.find("#compare-field").is_displayed()  # no bare G2P model is served
        assert page.find("#panel-main .prediction").text == "b a c"  # tokens, space-joined
        assert page.texts("#panel-main tbody th") == ["b", "a", "c"]
        np.testing.assert_allclose(page.heatmap(), reverse_attention("cab", 1.0), rtol=1e-6)
        Select(page.find("#model")).select_by_value("reverse")
        assert page.find("#compare-field").is_displayed()
        assert "reverse-none" in page.find("#compare-label").text  # same vocabularies
        # both bare models read and write characters, but of other data: no partner (the
        # kind of tokens only matches where a model does not say its vocabularies)
        Select(page.find("#model")).select_by_value("other-task")
        assert not page.find("#compare-field").is_displayed()


class LayeredRuntime(FakeRuntime):
    """A Transformer decoder of 2 layers of 3 heads: layer ``l``, head ``h`` draws
    ``reverse_attention`` at ``tau * map_scale(l, h)``, so every choice has its own map."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.manifest["decoder"] = "transformer"
        self.maps: list[tuple] = []

    @property
    def info(self) -> ModelInfo:
        return dataclasses.replace(super().info, attention_layers=2, attention_heads=3)

    @staticmethod
    def map_scale(layer: int | None, head: int | None) -> float:
        """1 for the default map (the last layer's mean over heads)."""
        return (2 if layer is None else layer + 1) / 2 * (1 if head is None else head + 2)

    def predict_batch(
        self, sources, temperature=None, with_attention=False, *, layer=None, head=None
    ):
        self.maps.append((layer, head))
        predictions, maps = super().predict_batch(sources, temperature, with_attention)
        if maps is not None:
            tau = self.manifest["temperature"] if temperature is None else temperature
            maps = [reverse_attention(s, tau * self.map_scale(layer, head)) for s in sources]
        return predictions, maps


def test_layer_and_head_selectors_only_for_models_that_have_them(browser) -> None:
    from selenium.webdriver.support.ui import Select

    layered = LayeredRuntime("layered")
    runtimes = {"layered": layered, "reverse": FakeRuntime("reverse")}
    with ThreadedServer(explorer_app(runtimes)) as server:
        page = Page(browser, server.url + "/?model=layered&source=abcd")
        assert page.find("#maps-field").is_displayed()
        assert page.texts("#layer option") == ["1", "2 (last)"]
        assert page.texts("#head option") == ["mean of 3", "1", "2", "3"]
        assert layered.maps[-1] == (None, None)  # the default map: no parameters sent
        np.testing.assert_allclose(page.heatmap(), reverse_attention("abcd", 1.0), rtol=1e-6)
        for control, value, maps in (("#layer", "0", (0, None)), ("#head", "2", (0, 2))):
            page.after_update(lambda c=control, v=value: Select(page.find(c)).select_by_value(v))
            assert layered.maps[-1] == maps
            expected = reverse_attention("abcd", LayeredRuntime.map_scale(*maps))
            np.testing.assert_allclose(page.heatmap(), expected, rtol=1e-6)
        assert "layer 1 of 2, head 3 of 3" in page.find("#panel-main .note").text
        page.after_update(lambda: Select(page.find("#model")).select_by_value("reverse"))
        assert not page.find("#maps-field").is_displayed()  # an RNN decoder has no layers to pick
        page = Page(browser, server.url + "/?model=layered&source=ab&layer=-2&head=1")
        assert layered.maps[-1] == (0, 1)
        page = Page(browser, server.url + "/?model=layered&source=ab&layer=-1&head=-1")
        assert layered.maps[-1] == (1, 2)  # negative indices count from the end, as the server's
        assert page.severe_console_messages() == []


def test_explorer_shows_bad_input_from_the_server(browser, fake_server: ThreadedServer) -> None:
    page = Page(browser, fake_server.url + "/")
    page.translate("abc")
    assert page.heatmap().shape == (3, 4)
    page.translate("x" * 13)  # max_source_length is 12: the server answers 400
    page.wait_until(lambda: page.find("#error").is_displayed(), "the error message")
    message = page.find("#error").text
    assert "(400)" in message and "max_source_length=12" in message and '"reverse"' in message
    assert page.heatmap().shape == (0, 0)  # the old map is not left standing under a new input
    page.translate("ab")
    assert not page.find("#error").is_displayed()
    np.testing.assert_allclose(page.heatmap(), reverse_attention("ab", 1.0), rtol=1e-6)


def test_explorer_shows_queue_full(browser) -> None:
    busy = FakeRuntime("busy")
    busy.gate.clear()  # every batch waits: the queue fills and stays full
    settings = ServerSettings(max_batch_size=1, max_queue=1, max_items_per_request=1)
    server = ThreadedServer(explorer_app({"busy": busy}, settings))
    with server, ThreadPoolExecutor(8) as pool:
        try:
            page = Page(browser, server.url + "/")
            held = []
            for _ in range(8):  # fill the queue until the server says so
                future = pool.submit(infer_json, server.url, "busy", "ab")
                try:
                    future.result(timeout=1.0)
                except FutureTimeoutError:
                    held.append(future)  # waiting at the gate
                    continue
                except httpx.HTTPStatusError as exc:
                    assert exc.response.status_code == 503
                    break
            else:
                pytest.fail("the queue never filled")
            page.translate("abc")
            page.wait_until(lambda: page.find("#error").is_displayed(), "the error message")
            message = page.find("#error").text
            assert "busy (503)" in message and "queue full" in message
            assert "Try again in 1 s" in message
        finally:
            busy.gate.set()
        assert [f.result(timeout=WAIT_S)["prediction"] for f in held] == ["ba"] * len(held)


# ---------------------------------------------------------------------------------------------
# Real models: Seq2Seq -> export_onnx -> serving.load -> the server -> the page


@pytest.fixture(scope="module")
def exported_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two small reversal models, with additive attention and without attention, exported."""
    from skattn import Seq2Seq
    from skattn.datasets import make_reversal

    X, y = make_reversal(600, 2, 6, alphabet="abcdef", random_state=0)
    directory = tmp_path_factory.mktemp("explorer-models")
    model_dirs = {}
    for name, attention in (("reverse-attention", "global"), ("reverse-none", "none")):
        model = Seq2Seq(
            attention=attention,
            embedding_dim=16,
            hidden_size=32,
            max_epochs=1000,
            max_steps=REAL_MODEL_STEPS,
            learning_rate=1e-2,
            batch_size=32,
            max_output_length=12,
            early_stopping=False,
            random_state=0,
        ).fit(X, y)
        model_dirs[name] = directory / name
        model.export_onnx(str(model_dirs[name]))
    return model_dirs


@pytest.mark.slow
def test_explorer_on_exported_models(browser, exported_models: dict, artifacts: Path) -> None:
    import serving

    runtimes = {name: serving.load(path, device="cpu") for name, path in exported_models.items()}
    attentive, bare = runtimes["reverse-attention"], runtimes["reverse-none"]
    source = "fedcab"
    with ThreadedServer(explorer_app(runtimes)) as server:
        page = Page(browser, server.url + "/")
        assert page.find("#model").get_attribute("value") == "reverse-attention"
        assert "additive score" in page.find("#model-info").text

        page.translate(source)
        prediction = attentive.predict([source])[0]
        (expected,) = attentive.predict_attention([source])  # (T_y, T_x)
        assert page.find("#panel-main .prediction").text == prediction
        assert expected.shape == (len(prediction), len(source) + 1)
        np.testing.assert_allclose(page.heatmap(), expected, rtol=1e-5, atol=1e-6)
        assert page.texts("#panel-main tbody th") == list(prediction)

        page.find('#panel-main tbody tr[data-row="0"] th').click()
        page.wait_until(lambda: page.texts("#panel-main .recipe li"), "the recipe")
        recipe_weights = [
            float(li.get_attribute("data-weight"))
            for li in page.driver.find_elements(page.by.CSS_SELECTOR, "#panel-main .recipe li")
        ]
        np.testing.assert_allclose(recipe_weights, np.sort(expected[0])[::-1], rtol=1e-5)

        for key, temperature in (("HOME", 0.05), ("END", 20.0)):
            page.slide_temperature(key)
            (at_t,) = attentive.predict_attention([source], temperature=temperature)
            assert (
                page.find("#panel-main .prediction").text
                == attentive.predict([source], temperature=temperature)[0]
            )
            np.testing.assert_allclose(page.heatmap(), at_t, rtol=1e-4, atol=1e-6)

        # "z" is no token of the model's (alphabet a-f): the column says what the model read
        assert sorted(attentive.info.source_tokens) == list("abcdef")
        page.translate("faz")
        page.wait_until(
            lambda: page.texts("#panel-main thead th[data-col]") == ["f", "a", "<unk>", "</s>"],
            "the <unk> label",
        )
        page.translate(source)

        page.find("#temperature-reset").click()
        page.after_update(lambda: page.find("#compare").click(), panel="compare")
        assert page.find("#panel-compare .prediction").text == bare.predict([source])[0]
        rows = page.heatmap("compare")
        assert rows.shape[1] == len(source) + 1
        np.testing.assert_array_equal(rows, final_state_attention(source, rows.shape[0]))

        page.find('#panel-main tbody tr[data-row="1"] th').click()
        page.wait_until(lambda: page.texts("#panel-main .recipe h3"), "the recipe")
        browser.save_screenshot(str(artifacts / "explorer-real-models.png"))
        assert page.severe_console_messages() == []


def test_the_page_splits_space_tokens_as_python_does(browser, fake_server: ThreadedServer) -> None:
    """The page labels columns with skattn's tokens: its "space" split must be str.split(),
    whose whitespace is not JavaScript's \\s (U+FEFF is one, U+0085 and U+001C-U+001F not)."""
    page = Page(browser, fake_server.url + "/")
    spaces = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())
    texts = [f"{s}a{s}b\ufeff{s}" for s in spaces] + ["a\x85b", "a\ufeffb", "  ", "x\x1cy z"]
    split = page.driver.execute_script(
        "return arguments[0].map((text) => tokenize(text, 'space'));", texts
    )
    assert split == [text.split() for text in texts]

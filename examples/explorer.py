"""Look at attention in a browser: train two reversal models, export them, serve the explorer.

The same encoder-decoder is trained twice to reverse strings ("abc" -> "cba"): once with
Bahdanau's additive attention, once without attention (the decoder only gets the final encoder
state). Both are exported with ``Seq2Seq.export_onnx``, loaded with ``serving.load`` and served
by one server, whose page at ``/`` draws their alignment matrices side by side::

    python examples/explorer.py                        # trains for a few minutes, then serves
    python examples/explorer.py --g2p-dir artifacts/g2p  # also serve an exported CMUdict model
    python examples/explorer.py --quick                # tiny models; checks the page and exits
    python examples/explorer.py --screenshot docs/explorer.png  # the README's picture

Open the printed URL, type a source such as ``hgfedcba``, click a row of the matrix to see that
output step's context-vector recipe, and move the temperature slider.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import uvicorn

import serving
from serving.__main__ import allowed_hosts, host_address
from serving.app import ServerSettings, create_app
from serving.explorer import mount_explorer
from serving.layout import default_intra_op_threads
from skattn import Seq2Seq
from skattn.argtypes import artifact_directory
from skattn.artifact_writer import check_export_directory
from skattn.datasets import make_reversal

ALPHABET = "abcdefgh"


# (samples, longest string, embedding, hidden units, epochs): --quick is a smoke run only
QUICK = (400, 6, 16, 32, 2)
FULL = (2000, 8, 32, 64, 12)


def train_reversal(attention: str, *, quick: bool, random_state: int = 0) -> Seq2Seq:
    """A Bahdanau encoder-decoder trained to reverse strings over ``ALPHABET``.

    Parameters
    ----------
    attention : {"global", "none"}
        Additive attention over the source, or none (final encoder state only).
    quick : bool
        Train a tiny model for a few seconds (a smoke run), not a useful one.
    random_state : int, default=0

    Returns
    -------
    Seq2Seq
        The fitted estimator.
    """
    n_samples, max_length, embedding_dim, hidden_size, max_epochs = QUICK if quick else FULL
    X, y = make_reversal(n_samples, 2, max_length, alphabet=ALPHABET, random_state=random_state)
    model = Seq2Seq(
        decoder="bahdanau",
        scorer="additive",
        attention=attention,
        embedding_dim=embedding_dim,
        hidden_size=hidden_size,
        max_epochs=max_epochs,
        batch_size=32,
        learning_rate=1e-2,
        max_output_length=2 * max_length,
        random_state=random_state,
    )
    started = time.monotonic()
    model.fit(X, y)
    X_test, y_test = make_reversal(
        200, 2, max_length, alphabet=ALPHABET, random_state=random_state + 1
    )
    print(
        f"trained attention={attention!r}: {model.n_iter_} epochs in "
        f"{time.monotonic() - started:.0f} s, exact-match accuracy on new strings "
        f"{model.score(X_test, y_test):.2f}"
    )
    return model


def load_runtimes(model_dirs: Mapping[str, Path], device: str = "auto") -> dict[str, object]:
    """``serving.load`` each exported model, under its name, as ``python -m serving`` does: one
    batch at a time on the cores but one (the event loop's)."""
    threads = default_intra_op_threads()
    return {
        name: serving.load(path, device=device, intra_op_num_threads=threads)
        for name, path in model_dirs.items()
    }


def build_app(runtimes: Mapping[str, object], host: str = "127.0.0.1"):
    """The server of ``python -m serving`` for several models, with the explorer at ``/``,
    bound to ``host``: on a loopback address, requests naming another ``Host`` get 400, as
    there (a DNS-rebinding page cannot reach it)."""
    app = create_app(runtimes, ServerSettings(allowed_hosts=allowed_hosts(None, host)))
    mount_explorer(app, runtimes)  # a no-op if create_app mounted it already
    return app


def smoke_check(url: str, names: Sequence[str]) -> None:
    """Fetch the page and the listing, and run one source through every model with attention."""
    with httpx.Client(base_url=url, timeout=30) as client:
        page = client.get("/")
        page.raise_for_status()
        if "explorer.js" not in page.text:
            raise RuntimeError("GET / did not return the explorer page")
        listing = {m["name"]: m for m in client.get("/v2/models").raise_for_status().json()}
        if sorted(listing) != sorted(names):
            raise RuntimeError(f"GET /v2/models lists {sorted(listing)}, expected {sorted(names)}")
        for name in names:
            body = {
                "inputs": [{"name": "source", "datatype": "BYTES", "shape": [1], "data": ["abc"]}],
                "outputs": [{"name": "prediction"}, {"name": "attention_lengths"}],
                "parameters": {"temperature": 0.5},
            }
            answer = client.post(f"/v2/models/{name}/infer", json=body).raise_for_status()
            outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
            print(
                f"{name}: 'abc' -> {outputs['prediction'][0]!r}, "
                f"attention map (T_y, T_x) = {tuple(outputs['attention_lengths'])}"
            )


def save_screenshot(url: str, path: Path, source: str = "hgfedcab") -> None:
    """Open the explorer in headless Chromium beside the no-attention model and save a PNG.

    Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package (dev extra).
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    with tempfile.TemporaryDirectory(prefix="skattn-chromium-") as profile:
        for flag in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1400,900",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
        try:
            driver.get(f"{url}?model=reverse-attention&compare=1&source={source}")
            WebDriverWait(driver, 30).until(
                lambda d: d.find_element(By.ID, "panel-compare").get_attribute("data-rows")
            )
            rows = driver.find_elements(By.CSS_SELECTOR, "#panel-main tbody tr th")
            rows[min(2, len(rows) - 1)].click()
            height = driver.execute_script("return document.documentElement.scrollHeight;")
            driver.set_window_size(1400, height + 150)  # the whole page, recipe included
            path.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(path))
        finally:
            driver.quit()
    print(f"screenshot saved to {path}")


def serve_in_thread(app, host: str) -> tuple[uvicorn.Server, threading.Thread, str]:
    """Start ``app`` on a free port of ``host``; return the server, its thread and its URL."""
    family, _, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)  # (IPv4 or IPv6, as the host is)
    sock.bind(address)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    shown = f"[{host}]" if ":" in host else host
    return server, thread, f"http://{shown}:{sock.getsockname()[1]}/"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, check, exit")
    parser.add_argument(
        "--g2p-dir", type=artifact_directory, help="an exported CMUdict G2P model to serve too"
    )
    parser.add_argument("--out", type=Path, help="where to export (default: a temporary folder)")
    parser.add_argument(
        "--host", type=host_address, default="127.0.0.1", help="(default: %(default)s)"
    )
    parser.add_argument("--port", type=int, default=8000, help="(default: %(default)s)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument(
        "--screenshot", type=Path, help="save a PNG of the page (headless Chromium) and exit"
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:  # uvicorn hangs, listening nowhere, on a port beyond it
        parser.error(f"--port must be in [0, 65535], got {args.port}")
    for name in ("reverse-attention", "reverse-none"):  # where the models go, before training
        if args.out is not None:
            try:
                check_export_directory(args.out / name)
            except ValueError as error:
                parser.error(f"--out: {error}")
    try:  # an address that does not resolve: one line now, not a traceback after training
        socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
    except OSError as error:
        parser.error(f"--host {args.host}: {error}")

    with tempfile.TemporaryDirectory(prefix="skattn-explorer-") as scratch:
        out = args.out or Path(scratch)
        model_dirs: dict[str, Path] = {}
        for name, attention in (("reverse-attention", "global"), ("reverse-none", "none")):
            model = train_reversal(attention, quick=args.quick)
            model_dirs[name] = out / name
            model.export_onnx(str(model_dirs[name]))
        if args.g2p_dir is not None:
            model_dirs["g2p"] = args.g2p_dir

        runtimes = load_runtimes(model_dirs, device=args.device)
        app = build_app(runtimes, args.host)
        if args.quick or args.screenshot:
            server, thread, url = serve_in_thread(app, args.host)
            try:
                print(f"the explorer answers at {url}")
                smoke_check(url, list(runtimes))
                if args.screenshot:
                    save_screenshot(url, args.screenshot)
            finally:
                server.should_exit = True
                thread.join(timeout=30)
            return 0
        print(f"\nOpen the attention explorer at http://{args.host}:{args.port}/  (Ctrl-C stops)\n")
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())

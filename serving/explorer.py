"""The attention explorer: a web page, served at ``GET /``, that draws a model's alignment matrix.

The page (``serving/static/``: plain HTML, JavaScript and CSS, no build step, nothing fetched
from elsewhere) talks to the server through the same Open Inference Protocol endpoint as any
client, ``POST /v2/models/{name}/infer``, asking for the ``attention`` and
``attention_lengths`` outputs and sending ``parameters.temperature``. To discover the models it
reads one endpoint that the protocol does not define::

    GET /v2/models      [{"name", "ready", "decoder", "attention", "scorer", "tokenizer",
                          "temperature", "output_kind", "max_source_length",
                          "vocabulary_id"}, ...]

one entry per served model, in name order. ``attention`` is ``"none"`` for a model without
attention, which the page offers to show side by side with an attention model of the same task:
one with the same ``vocabulary_id`` (a digest of the source and target vocabularies), else the
same tokenizer and output kind.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).with_name("static")

# The page loads only its own files; the favicon is an inline data: URL.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)

_MANIFEST_FIELDS = ("decoder", "attention", "scorer", "tokenizer", "temperature", "output_kind")


def model_summary(name: str, runtime: object, ready: bool) -> dict:
    """What the explorer needs to know about one served model.

    Parameters
    ----------
    name : str
        The name the model is served under.
    runtime : object
        The model's runtime (``serving.load``); its ``manifest`` dict gives the decoder kind,
        attention kind, scorer, tokenizer, default temperature and output kind.
    ready : bool
        Whether the model answers inference requests now.

    Returns
    -------
    dict
        ``name``, ``ready``, the manifest fields (``None`` where the manifest lacks one;
        ``temperature`` defaults to 1.0, ``output_kind`` to ``"str"``),
        ``max_source_length`` and ``vocabulary_id``: the first 16 hex digits of the SHA-256 of
        the source and target vocabularies (``None`` without them), equal for models trained
        on the same data.
    """
    manifest = getattr(runtime, "manifest", None) or {}
    summary: dict = {"name": name, "ready": bool(ready)}
    for field in _MANIFEST_FIELDS:
        summary[field] = manifest.get(field)
    summary["temperature"] = float(manifest.get("temperature", 1.0))
    summary["output_kind"] = manifest.get("output_kind", "str")
    max_length = getattr(runtime, "max_source_length", None)
    summary["max_source_length"] = None if max_length is None else int(max_length)
    summary["vocabulary_id"] = _vocabulary_id(manifest)
    return summary


def _vocabulary_id(manifest: Mapping) -> str | None:
    vocabularies = [manifest.get("source_vocabulary"), manifest.get("target_vocabulary")]
    if None in vocabularies:
        return None
    text = json.dumps(vocabularies, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def mount_explorer(
    app: FastAPI,
    runtimes: Mapping[str, object],
    *,
    is_ready: Callable[[str], bool] | None = None,
) -> None:
    """Add the explorer page (``GET /``, ``/static/...``) and ``GET /v2/models`` to an app.

    Calling it again on the same app does nothing, so ``create_app`` and a script may both
    call it.

    Parameters
    ----------
    app : FastAPI
        The server app (``serving.app.create_app``); its inference endpoint answers the page.
    runtimes : mapping of str to runtime
        Model name -> runtime, the same mapping the app serves.
    is_ready : callable, optional
        ``is_ready(name) -> bool`` for the listing's ``ready`` field. Default: the model's
        batcher runs (``app.state.models[name].batcher.running``) when the app keeps one,
        else True.

    Raises
    ------
    ValueError
        If ``runtimes`` is not a non-empty mapping, or the static files are missing.
    """
    if not isinstance(runtimes, Mapping) or not runtimes:
        raise ValueError("runtimes must be a non-empty mapping of model name to runtime")
    if not (STATIC_DIR / "index.html").is_file():
        raise ValueError(f"the explorer's static files are missing from {STATIC_DIR}")
    if getattr(app.state, "explorer_mounted", False):
        return
    app.state.explorer_mounted = True
    names = sorted(runtimes)
    ready = is_ready if is_ready is not None else _batcher_ready(app)

    @app.get("/", include_in_schema=False)
    async def explorer_page() -> FileResponse:
        return FileResponse(
            STATIC_DIR / "index.html",
            media_type="text/html; charset=utf-8",
            headers={
                "Content-Security-Policy": CONTENT_SECURITY_POLICY,
                "Cache-Control": "no-cache",
            },
        )

    @app.get("/v2/models")
    async def list_models() -> JSONResponse:
        return JSONResponse([model_summary(name, runtimes[name], ready(name)) for name in names])

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="explorer-static")


def _batcher_ready(app: FastAPI) -> Callable[[str], bool]:
    """``is_ready`` from the batchers that ``create_app`` keeps in ``app.state.models``."""

    def ready(name: str) -> bool:
        model = getattr(app.state, "models", {}).get(name)
        batcher = getattr(model, "batcher", None)
        return True if batcher is None else bool(batcher.running)

    return ready

"""The attention explorer: a web page, served at ``GET /``, that draws a model's alignment matrix.

The page (``serving/static/``: plain HTML, JavaScript and CSS, no build step, nothing fetched
from elsewhere) talks to the server through the same Open Inference Protocol endpoint as any
client, ``POST /v2/models/{name}/infer``, asking for the ``attention`` and
``attention_lengths`` outputs and sending ``parameters.temperature``. To discover the models it
reads one endpoint that the protocol does not define::

    GET /v2/models      [{"name", "ready", "decoder", "attention", "scorer", "tokenizer",
                          "temperature", "output_kind", "max_source_length",
                          "vocabulary_id", "attention_layers", "attention_heads",
                          "source_tokens"}, ...]

one entry per served model, in name order. ``attention`` is ``"none"`` for a model without
attention, which the page offers to show side by side with an attention model of the same task:
one with the same ``vocabulary_id`` (a digest of the source and target vocabularies), else the
same tokenizer and output kind. ``attention_layers`` and ``attention_heads`` (0 when the model
has none) size the page's layer and head selectors, which send ``parameters.attention_layer``
and ``attention_head``. ``source_tokens`` (empty when the vocabulary is large or unknown) lets
the page label a typed token outside the vocabulary ``<unk>``, as the model reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.staticfiles import NotModifiedResponse
from starlette.types import Receive, Scope, Send

from serving.interface import ModelInfo, Runtime

STATIC_DIR = Path(__file__).with_name("static")

# The page loads only its own files; the favicon is an inline data: URL.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)

_SUMMARY_FIELDS = (
    "decoder",
    "attention",
    "scorer",
    "tokenizer",
    "temperature",
    "output_kind",
    "max_source_length",
    "vocabulary_id",
    "attention_layers",
    "attention_heads",
    "source_tokens",
)


def model_summary(name: str, info: ModelInfo, ready: bool) -> dict:
    """What the explorer needs to know about one served model.

    Parameters
    ----------
    name : str
        The name the model is served under.
    info : ModelInfo
        The model's record (``runtime.info``).
    ready : bool
        Whether the model answers inference requests now.

    Returns
    -------
    dict
        ``name``, ``ready``, and from ``info``: ``decoder``, ``attention``, ``scorer``,
        ``tokenizer``, ``temperature``, ``output_kind``, ``max_source_length``,
        ``vocabulary_id`` (equal for models trained on the same data), ``attention_layers``,
        ``attention_heads`` and ``source_tokens`` (a list).
    """
    fields = asdict(info)
    summary: dict = {"name": name, "ready": bool(ready)}
    summary.update({field: fields[field] for field in _SUMMARY_FIELDS})
    summary["source_tokens"] = list(summary["source_tokens"])
    return summary


def mount_explorer(
    app: FastAPI,
    runtimes: Mapping[str, Runtime],
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
    runtimes : mapping of str to Runtime
        Model name -> runtime, the same mapping the app serves (only ``info`` is read).
    is_ready : callable, optional
        ``is_ready(name) -> bool`` for the listing's ``ready`` field (``create_app`` passes
        whether the model's batcher runs). Default: always True.

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
    infos = {name: runtimes[name].info for name in sorted(runtimes)}
    ready = is_ready if is_ready is not None else (lambda name: True)

    @app.get("/", include_in_schema=False)
    async def explorer_page() -> FileResponse:
        return _WholeFile(
            STATIC_DIR / "index.html",
            media_type="text/html; charset=utf-8",
            headers={
                "Content-Security-Policy": CONTENT_SECURITY_POLICY,
                "Cache-Control": "no-cache",
                "X-Content-Type-Options": "nosniff",
            },
        )

    @app.get("/v2/models")
    async def list_models() -> JSONResponse:
        return JSONResponse(
            [model_summary(name, info, ready(name)) for name, info in infos.items()]
        )

    app.mount("/static", _StaticFiles(directory=STATIC_DIR), name="explorer-static")


class _WholeFile(FileResponse):
    """A file sent whole, whatever ``Range`` asks: the explorer's few kilobytes need no ranges
    (RFC 9110 lets a server ignore the header), and Starlette answers a malformed or
    unsatisfiable one itself, in plain text, where every other error of the server is JSON."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        del self.headers["accept-ranges"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"range", b"if-range")]
        await super().__call__({**scope, "headers": headers}, receive, send)


class _StaticFiles(StaticFiles):
    """The page's script and style, revalidated on every load (an upgraded server's page must
    not run a cached older script: browsers otherwise cache by a guess from the file's age),
    never sniffed as another type, and sent whole (:class:`_WholeFile`)."""

    def file_response(
        self, full_path, stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        response = _WholeFile(full_path, status_code=status_code, stat_result=stat_result)
        if self.is_not_modified(response.headers, Headers(scope=scope)):
            response = NotModifiedResponse(response.headers)
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

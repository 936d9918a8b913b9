"""``python -m serving --model-dir DIR`` (or ``--model NAME``, a packaged model): serve over the
Open Inference Protocol.

Logs are JSON lines on stderr. SIGTERM (or Ctrl-C) stops accepting connections, finishes the
requests in flight, drains the batch queue and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from serving.app import check_instances
from serving.connections import LINGER_IDLE_S
from serving.interface import Runtime
from serving.layout import default_intra_op_threads
from serving.packaged import packaged_model_dir, packaged_models
from serving.process import LOG_LEVELS, configure_logging, serve
from serving.settings import (
    BATCHING,
    MAX_CONNECTION_AGE_S,
    MAX_TIMEOUT_S,
    ConnectionLimits,
    ServerSettings,
    check_model_name,
    fit_to_file_limit,
    host_name,
    is_no_limit,
)
from skattn.core.checks import DEVICE_PATTERN, check_int, check_real

logger = logging.getLogger("serving")


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: The settings whose flag is the field's name (``max_batch_size``: ``--max-batch-size``).
_FLAG_FIELDS = frozenset(
    f.name
    for cls in (ServerSettings, ConnectionLimits)
    for f in dataclasses.fields(cls)
    if f.name not in ("allowed_hosts", "eager_batching")
)


def allowed_hosts(given: Sequence[str] | None, bind: str) -> tuple[str, ...] | None:
    """The Host allow-list: ``given`` ('*' among them: any), else the loopback names and
    ``bind`` itself when ``bind`` is a loopback address (a DNS-rebinding page then cannot reach
    the server), else any (None)."""
    if given:
        return None if "*" in given else tuple(given)
    if not _loopback(bind):
        return None
    return tuple(dict.fromkeys([*LOOPBACK_HOSTS, host_name(bind)]))  # 127.0.0.2 too


def _loopback(bind: str) -> bool:
    """Whether ``bind`` is a loopback address, or a name whose every address is one (as the
    server will bind it: ``LOCALHOST`` and ``127.1`` too, which a comparison with "localhost"
    and a parse of the dotted quad missed, leaving the Host check off on the loopback)."""
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(bind, None)}
    except (OSError, UnicodeError):  # not a name this machine resolves: uvicorn will say so
        return False
    return bool(addresses) and all(
        ipaddress.ip_address(address.partition("%")[0]).is_loopback for address in addresses
    )


def _model_dir(value: str) -> tuple[str | None, Path]:
    """``DIR`` or ``NAME=DIR`` -> (name or None, directory); an empty ``DIR`` is refused (it
    would be the working directory, served without a word)."""
    name, sep, rest = value.partition("=")
    if sep and name and "/" not in name and not Path(value).is_dir():
        if not rest:
            raise argparse.ArgumentTypeError(f"{value!r} names no directory after the '='")
        return name, Path(rest)
    if not value:
        raise argparse.ArgumentTypeError("an empty DIR: name the artifact's directory")
    return None, Path(value)


def host_address(value: str) -> str:
    """``--host``: an address or name; an empty one is refused (uvicorn would bind every
    interface, with the Host check off: an unset ``--host "$HOST"`` must not do that)."""
    if not value.strip():
        raise argparse.ArgumentTypeError(
            "an empty address: name one (0.0.0.0 or :: binds every interface)"
        )
    return value


def _flag_error(error: ValueError) -> str:
    """A settings error in the words of the command line: ``max_batch_size must ...`` reads
    ``--max-batch-size must ...`` (the settings' fields are the flags' names)."""
    message = str(error)
    field = message.split(" ", 1)[0]
    if field in _FLAG_FIELDS:
        return "--" + field.replace("_", "-") + message[len(field) :]
    return message


def _packaged(value: str) -> tuple[str, Path]:
    """A packaged model's ``NAME`` -> (name, its directory)."""
    try:
        return value, packaged_model_dir(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device(value: str) -> str:
    if DEVICE_PATTERN.fullmatch(value):
        return value
    raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N, not {value!r}")


def _seconds_or_none(value: str) -> float | None:
    """``none`` (no limit) or a number (checked with the other limits)."""
    if is_no_limit(value):
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seconds or none, not {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m serving``."""
    defaults = ServerSettings()
    parser = argparse.ArgumentParser(
        prog="python -m serving",
        description="Serve an exported skattn model over the Open Inference Protocol (KServe v2).",
    )
    parser.add_argument(
        "--model-dir",
        action="append",
        default=[],
        type=_model_dir,
        metavar="[NAME=]DIR",
        help="artifact directory (export_onnx); repeat as NAME=DIR to serve several models, "
        "each under its own name (default name: the directory's)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        type=_packaged,
        metavar="NAME",
        help="a model that ships with skattn, served under its name (repeatable; with or "
        f"without --model-dir): {', '.join(packaged_models()) or 'none in this install'}",
    )
    parser.add_argument(
        "--model-name", help="name to serve a single --model-dir under (default: its directory's)"
    )
    parser.add_argument(
        "--host",
        type=host_address,
        default="127.0.0.1",
        help="address to bind (default: %(default)s)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        metavar="HOST",
        help="a host name (no port) a request's Host header may name (repeat for several; "
        "'*': any); others get 400 (default: localhost, 127.0.0.1, ::1 and --host when --host "
        "is a loopback address, else any)",
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=defaults.max_batch_size,
        help="most items per onnxruntime call (default: %(default)s)",
    )
    parser.add_argument(
        "--max-batch-chars",
        type=int,
        default=defaults.max_batch_chars,
        help="most padded source characters per onnxruntime call (items x the longest); "
        "requests take turns at leading a batch (default: %(default)s)",
    )
    parser.add_argument(
        "--max-delay-ms",
        type=float,
        default=defaults.max_delay_ms,
        help="longest an item waits for its batch to fill (default: %(default)s)",
    )
    parser.add_argument(
        "--eager-batching",
        action=argparse.BooleanOptionalAction,
        default=defaults.eager_batching,
        help="take a batch as soon as the worker is free and no request is being read; "
        "--no-eager-batching always waits --max-delay-ms for a batch to fill "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--batching",
        choices=BATCHING,
        default=defaults.batching,
        help="dynamic: a batch's whole search runs before the next batch forms; continuous: "
        "items join the running decoder steps and leave the step they end, with no delay "
        "(--max-delay-ms and --eager-batching do not apply); greedy RNN-decoder models without "
        "local-m on host memory only, the others (beam search, IO binding) are batched "
        "dynamically (default: %(default)s)",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=defaults.instances,
        help="batches in inference at once, each on its own thread, as Triton's model "
        "instances; for models whose search is the server's main cost (beam search, the G2P "
        "models), as many as the usable cores; dynamic batching on the CPU only (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=defaults.max_queue,
        help="most items waiting; beyond it 503 (default: %(default)s)",
    )
    parser.add_argument(
        "--max-items-per-request",
        type=int,
        help="most sources in one request; beyond it 413 "
        f"(default: {defaults.max_items_per_request}, or --max-queue if smaller)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=defaults.max_body_bytes,
        help="largest request body; beyond it 413 (default: %(default)s)",
    )
    parser.add_argument(
        "--max-output-elements",
        type=int,
        default=defaults.max_output_elements,
        help="most tensor elements in one response (attention maps count N x T_y x T_x, "
        "T_y at the model's max_output_length, checked before decoding); beyond it 413 "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--retry-after-s",
        type=int,
        default=defaults.retry_after_s,
        help="the Retry-After (seconds) that comes with a 503 (default: %(default)s)",
    )
    connections = ConnectionLimits()
    parser.add_argument(
        "--body-timeout-s",
        type=float,
        default=defaults.body_timeout_s,
        help="longest a request body may take to arrive; beyond it 408 and close "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--header-timeout-s",
        type=float,
        default=connections.header_timeout_s,
        help="longest a request's line and headers may take, from the connection's start or "
        "the request's first byte; beyond it 408 and close (default: %(default)s)",
    )
    parser.add_argument(
        "--max-header-bytes",
        type=int,
        default=connections.max_header_bytes,
        help="most bytes of request line and headers; beyond it 431 and close "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=connections.max_connections,
        help="open connections before the longest-idle one is closed for a new one; lowered "
        "to fit the file-descriptor limit (default: %(default)s)",
    )
    parser.add_argument(
        "--health-connections",
        type=int,
        default=connections.health_connections,
        help="connections admitted beyond --max-connections when none is idle, for "
        "/v2/health/* only (default: %(default)s)",
    )
    parser.add_argument(
        "--keep-alive-s",
        type=float,
        default=connections.keep_alive_s,
        help="how long an idle kept-alive connection stays open (default: %(default)s)",
    )
    parser.add_argument(
        "--send-timeout-s",
        type=float,
        default=connections.send_timeout_s,
        help="longest a connection's answer may drain nothing (its client reads nothing) "
        "before it is aborted; a client reading slowly keeps it (default: %(default)s)",
    )
    parser.add_argument(
        "--max-connection-age-s",
        type=_seconds_or_none,
        default=connections.max_connection_age_s,
        help="a connection's first answer after this long (within 10%%) says Connection: close "
        "and closes it, so kept-alive clients reconnect and spread over replicas started since "
        f"(at most {MAX_CONNECTION_AGE_S:g}; default: none, no limit)",
    )
    parser.add_argument(
        "--linger-s",
        type=float,
        default=connections.linger_s,
        help="how long a connection the server closes reads and drops what its client still "
        "sends, so that the client reads its last answer (a 413 to a long body) rather than a "
        f"reset; it closes sooner when the client closes or is silent for {LINGER_IDLE_S:g} s "
        "(nginx's lingering_close; 0: close at once; default: %(default)s)",
    )
    parser.add_argument(
        "--device",
        type=_device,
        default="auto",
        help="auto, cpu, cuda or cuda:N (default: %(default)s)",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        help="onnxruntime threads per operator (default: usable cores - 1, leaving a core to "
        "the HTTP event loop, shared among the --instances, at least 1 each: "
        f"{default_intra_op_threads()} here for one instance)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM, seconds to wait for requests in flight (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="(default: %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, load the model and serve it until SIGTERM.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: 0 after a graceful shutdown, 2 for bad arguments or a bad artifact,
        1 (with a line saying why) when the server could not start: its address in use, say.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        settings = ServerSettings(
            max_batch_size=args.max_batch_size,
            max_delay_ms=args.max_delay_ms,
            max_batch_chars=args.max_batch_chars,
            max_queue=args.max_queue,
            max_items_per_request=(
                min(ServerSettings.max_items_per_request, args.max_queue)
                if args.max_items_per_request is None
                else args.max_items_per_request
            ),
            max_body_bytes=args.max_body_bytes,
            max_output_elements=args.max_output_elements,
            body_timeout_s=args.body_timeout_s,
            retry_after_s=args.retry_after_s,
            allowed_hosts=allowed_hosts(args.allowed_host, args.host),
            eager_batching=args.eager_batching,
            batching=args.batching,
            instances=args.instances,
        )
        limits = ConnectionLimits(
            header_timeout_s=args.header_timeout_s,
            max_header_bytes=args.max_header_bytes,
            max_connections=args.max_connections,
            health_connections=args.health_connections,
            keep_alive_s=args.keep_alive_s,
            send_timeout_s=args.send_timeout_s,
            retry_after_s=args.retry_after_s,
            max_connection_age_s=args.max_connection_age_s,
            linger_s=args.linger_s,
        )
        limits = fit_to_file_limit(limits)  # before any model loads: a limit too low is an error
    except ValueError as exc:
        parser.error(_flag_error(exc))
    try:
        check_int(args.port, "--port", 0, 65535)
        check_real(args.shutdown_timeout, "--shutdown-timeout", 0.0, MAX_TIMEOUT_S, low_open=True)
        if args.intra_op_threads is None:
            args.intra_op_threads = default_intra_op_threads(settings.instances)
        check_int(args.intra_op_threads, "--intra-op-threads")
    except ValueError as exc:
        parser.error(str(exc))
    if not args.model_dir and not args.model:
        parser.error("name a model to serve: --model-dir DIR (an export) or --model NAME")
    if args.model_name is not None:
        if len(args.model_dir) != 1 or args.model_dir[0][0] is not None:
            parser.error(
                "--model-name names a single --model-dir DIR (packaged --model NAMEs keep "
                "their names); use NAME=DIR for several"
            )
        args.model_dir = [(args.model_name, args.model_dir[0][1])]
    for name, _ in args.model_dir:  # checked before any model loads
        if name is not None:
            try:
                check_model_name(name)
            except ValueError as exc:
                parser.error(str(exc))
    named = [name for name, _ in args.model_dir if name is not None]
    for name, _ in args.model:
        if name in named:
            parser.error(f"--model {name}: another model is served under that name too")
        named.append(name)
    args.model_dir = [*args.model_dir, *args.model]
    runtimes = {}
    for name, model_dir in args.model_dir:
        runtime = _load(model_dir, args.device, name, args.intra_op_threads, args.max_batch_size)
        if runtime is None:
            return 2
        if runtime.info.name in runtimes:
            parser.error(
                f"two models are named {runtime.info.name!r}; name them with "
                "--model-dir NAME=DIR (packaged --model NAMEs keep their names)"
            )
        runtimes[runtime.info.name] = runtime
        try:
            check_instances({runtime.info.name: runtime}, settings.instances)
        except ValueError as exc:
            parser.error(_flag_error(exc))
        logger.info(
            "model loaded",
            extra={
                "model": runtime.info.name,
                "model_dir": str(model_dir),
                "provider": runtime.info.provider,
            },
        )
    try:
        serve(
            runtimes,
            settings,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            shutdown_timeout=args.shutdown_timeout,
            limits=limits,
        )
    except KeyboardInterrupt:
        pass
    return 0


def _load(
    model_dir: Path, device: str, name: str | None, intra_op_threads: int, max_batch_size: int
) -> Runtime | None:
    """``serving.load`` with a one-line message instead of a traceback on a bad artifact; a
    batch of the server's is one onnxruntime call (``max_batch_size``), on its intra-op
    threads."""
    from serving import load  # lazily: the runtime brings onnxruntime

    if not model_dir.is_dir():
        print(f"error: --model-dir {model_dir} is not a directory", file=sys.stderr)
        return None
    try:
        return load(
            model_dir,
            device=device,
            name=name,
            intra_op_num_threads=intra_op_threads,
            max_batch_size=max_batch_size,
        )
    except Exception as exc:  # a bad artifact can fail in many ways; all mean "cannot serve"
        print(f"error: cannot load the model in {model_dir}: {exc}", file=sys.stderr)
        return None


if __name__ == "__main__":
    sys.exit(main())

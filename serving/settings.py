"""The server's settings: every limit, delay and switch of the HTTP app (``ServerSettings``) and of
its connections (``ConnectionLimits``, which :mod:`serving.connections` enforces), validated when
built.

``python -m serving`` maps each field to a flag of the same name (``max_body_bytes`` is
``--max-body-bytes``); the README's server section lists them with their defaults.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, replace

from serving.batcher import MAX_DELAY_MS, MAX_INSTANCES
from skattn.core.checks import check_int, check_real

__all__ = [
    "BATCHING",
    "ConnectionLimits",
    "ServerSettings",
    "check_model_name",
    "fit_to_file_limit",
    "host_name",
    "is_no_limit",
]

logger = logging.getLogger("serving.settings")

#: The longest a timeout may be set (an hour): beyond it the protection it exists for is off.
MAX_TIMEOUT_S = 3600.0

#: The longest connection age limit (a day; gRPC's ``MAX_CONNECTION_AGE`` is often hours).
MAX_CONNECTION_AGE_S = 86400.0

#: The batching designs (``ServerSettings.batching``).
BATCHING = ("dynamic", "continuous")


@dataclass(frozen=True)
class ServerSettings:
    """Limits and batching settings of the server (validated when built).

    Parameters
    ----------
    max_batch_size : int, default=64
        The most items in one runtime call.
    max_delay_ms : float, default=2.0
        The longest an item waits for others to join its batch.
    max_batch_chars : int, default=8192
        The most padded source characters in one runtime call (items x the longest): 64 items
        of up to 128 characters make a full batch, 8 of 1,024 do. Requests take turns at
        leading a batch, so this bounds how long a request of long items holds the worker
        before the requests queued after it get a batch.
    max_queue : int, default=1024
        The most items waiting per model; beyond it requests get 503 with Retry-After.
    max_items_per_request : int, default=256
        The most sources in one request; beyond it 413.
    max_body_bytes : int, default=1048576
        The largest request body (after decompression); beyond it 413.
    max_output_elements : int, default=1048576
        The most tensor elements one response may hold (every output counted: an attention
        map of N items is ``N x max T_y x max T_x``); beyond it 413, naming the limit. A
        request for attention is measured before it is decoded, at the most its maps can
        hold: ``max_output_length`` rows (the model's limit) by its longest source's tokens
        + 1, so a request refused never fills the memory with maps first, and whether a
        request passes depends on its shape only, not on what the model answers.
        2**20 elements are 4 MiB as binary FP32 and about 20 MB as JSON; they hold the
        prediction and attention of 256 items of up to 62 source tokens from a model whose
        ``max_output_length`` is 64. A small request (one
        character per source) can otherwise ask for a response thousands of times its size.
    body_timeout_s : float, default=10.0
        The longest a request body may take to arrive, from the end of its headers; beyond
        it 408 and the connection is closed. A 1 MiB body (``max_body_bytes``) then needs
        105 kB/s, which any client of a model server has; a client that declares a body and
        never sends it no longer holds a connection and a batcher slot forever.
    allowed_hosts : tuple of str, optional
        The host names (no port) a request's ``Host`` header may name; others get 400 (a
        DNS-rebinding defence). None (the default here) or ``"*"`` among them allows any;
        ``python -m serving`` allows only ``localhost``, ``127.0.0.1``, ``::1`` and the address
        itself when it binds a loopback address.
    retry_after_s : int, default=1
        The ``Retry-After`` a client gets with a 503.
    eager_batching : bool, default=True
        Take a batch as soon as the worker is free and no request is being read, instead of
        waiting out ``max_delay_ms`` (which still bounds the wait while requests are being
        read): a lone client gets the unbatched latency, concurrent ones still share batches.
    batching : {"dynamic", "continuous"}, default="dynamic"
        ``"dynamic"``: a batch's whole search runs before the next batch is formed
        (:class:`serving.batcher.Batcher`). ``"continuous"``: the decoder steps over a running
        set that items join at the next step and leave the step they end
        (:class:`serving.continuous.ContinuousBatcher`), for the models that can
        (:func:`serving.running.continuous_support`: greedy, RNN decoder, no local-m); the
        others are batched dynamically, with a warning in the log.
    instances : int, default=1
        Batches in inference at once (1 to 64), each on its own inference thread, as Triton
        runs a model's instances. One leaves the search one thread: a model whose search is
        the server's main cost (the G2P models, beam search) serves more with as many
        instances as the cores it may use, each runtime on one intra-op thread. Dynamic
        batching only (``batching="continuous"`` steps one running set), and CPU runtimes
        only (IO binding runs one call at a time).
    """

    max_batch_size: int = 64
    max_delay_ms: float = 2.0
    max_batch_chars: int = 8192
    max_queue: int = 1024
    max_items_per_request: int = 256
    max_body_bytes: int = 1 << 20
    max_output_elements: int = 1 << 20
    body_timeout_s: float = 10.0
    allowed_hosts: tuple[str, ...] | None = None
    retry_after_s: int = 1
    eager_batching: bool = True
    batching: str = "dynamic"
    instances: int = 1

    def __post_init__(self) -> None:
        for name in (
            "max_batch_size",
            "max_batch_chars",
            "max_queue",
            "max_items_per_request",
            "max_body_bytes",
            "max_output_elements",
            "retry_after_s",
        ):
            check_int(getattr(self, name), name)
        check_int(self.instances, "instances", 1, MAX_INSTANCES)
        check_real(self.max_delay_ms, "max_delay_ms", 0.0, MAX_DELAY_MS)
        check_real(self.body_timeout_s, "body_timeout_s", 0.0, MAX_TIMEOUT_S, low_open=True)
        if self.allowed_hosts is not None and (
            not isinstance(self.allowed_hosts, tuple)
            or not all(isinstance(host, str) and host for host in self.allowed_hosts)
        ):
            raise ValueError(
                f"allowed_hosts must be None or a tuple of host names, got {self.allowed_hosts!r}"
            )
        for host in self.allowed_hosts or ():
            if host != "*" and host_name(host) != host.strip().lower():  # never matched
                raise ValueError(
                    "allowed_hosts (--allowed-host) takes host names without a port or "
                    f"brackets (a Host header's port is not compared): got {host!r}, "
                    f"meaning {host_name(host)!r}"
                )
        if not isinstance(self.eager_batching, bool):
            raise ValueError(f"eager_batching must be a bool, got {self.eager_batching!r}")
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {list(BATCHING)}, got {self.batching!r}")
        if self.batching == "continuous" and self.instances != 1:
            raise ValueError(
                f"instances must be 1 with batching='continuous' (one running set of decoder "
                f"steps), got {self.instances}; several batches at once are for "
                "batching='dynamic'"
            )
        if self.max_items_per_request > self.max_queue:
            raise ValueError(
                f"max_items_per_request ({self.max_items_per_request}) must not exceed "
                f"max_queue ({self.max_queue}): such a request could never be queued"
            )


def check_model_name(name: object, where: str = "") -> None:
    """Raise ``ValueError`` unless ``name`` can be a path segment: a non-empty str without '/',
    and not '.' or '..' (which clients collapse: ``v2/models/../infer`` is ``v2/infer``)."""
    if not isinstance(name, str):
        raise ValueError(f"{where}model name {name!r} must be a str")
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(
            f"{where}model name {name!r} must be non-empty, hold no '/' and not be '.' or '..'"
        )


def host_name(host: str) -> str:
    """The host of a ``Host`` header, lower-cased, without its port (``[::1]:8000`` -> ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_no_limit(value: object) -> bool:
    """Whether ``value`` sets an optional limit to none: None, or the word ``none`` (any case),
    as the command line, ``serve run`` and YAML may give it."""
    return value is None or (isinstance(value, str) and value.strip().lower() == "none")


# File descriptors the process needs besides its connections: the listening socket, epoll,
# the model files onnxruntime maps, logs, the interpreter's own.
RESERVED_FILES = 64


@dataclass(frozen=True)
class ConnectionLimits:
    """Limits of the HTTP connections (validated when built).

    Parameters
    ----------
    header_timeout_s : float, default=10.0
        The longest a request's line and headers may take to arrive, from the connection's
        start or the request's first byte. tritonclient and curl send them in one write; 10 s
        leaves room for a congested link and none for a client that trickles them.
    max_header_bytes : int, default=32768
        The most bytes of request line and headers (nginx's default buffers hold 32 KiB;
        tritonclient sends a few hundred bytes); beyond it 431.
    max_connections : int, default=512
        The most open connections before an idle one is closed for a new one (and at most
        the file-descriptor limit minus what the process needs, see :func:`fit_to_file_limit`).
    health_connections : int, default=8
        Connections admitted beyond ``max_connections`` when none is idle, for health checks.
    keep_alive_s : float, default=5.0
        How long an idle kept-alive connection stays open (uvicorn's ``timeout_keep_alive``).
    send_timeout_s : float, default=30.0
        The longest a connection's answer may drain nothing (its writes paused, the client
        reading nothing) before it is aborted; a client that reads, however slowly, keeps it.
    retry_after_s : int, default=1
        The ``Retry-After`` (seconds) of the 503 a connection over the bound gets (the server
        passes its ``--retry-after-s``, the same as the queue's 503 carries).
    max_connection_age_s : float or None, default=None
        How long a connection carries requests (nginx's ``keepalive_time``, gRPC's
        ``MAX_CONNECTION_AGE``): the first answer that starts after it says ``Connection:
        close`` and the connection closes once it is sent, so that a client's kept-alive pool
        reconnects and is spread anew, over replicas started since (a shared port, a Kubernetes
        Service). Each connection's age is drawn within 10 % of it, so that connections opened
        together do not all close together. Requests already received behind that answer on the
        connection (pipelined, or begun) are answered first, the last of them with the close.
        At most a day; None: no limit.
    linger_s : float, default=30.0
        How long a connection the server closes keeps reading, and dropping, what its client
        still sends (nginx's ``lingering_close`` and ``lingering_time``): the server stops
        writing (a FIN after its last answer), and closes when the client does, after
        :data:`serving.connections.LINGER_IDLE_S` (5 s) without a byte from it, or after
        ``linger_s``. Closing a socket with unread bytes makes the kernel answer with a reset
        that can overtake the last answer: a client still sending a body over
        ``max_body_bytes`` (Python's ``http.client``, ``requests``) would get a reset, not the
        413. A lingering connection takes no slot of ``max_connections`` or
        ``health_connections``; the longest-lingering ones are closed while the sockets are
        over both together. A stopping server does not linger. At most an hour; 0: close at
        once.
    """

    header_timeout_s: float = 10.0
    max_header_bytes: int = 32768
    max_connections: int = 512
    health_connections: int = 8
    keep_alive_s: float = 5.0
    send_timeout_s: float = 30.0
    retry_after_s: int = 1
    max_connection_age_s: float | None = None
    linger_s: float = 30.0

    def __post_init__(self) -> None:
        check_real(
            self.max_connection_age_s, "max_connection_age_s", 0.0, MAX_CONNECTION_AGE_S,
            low_open=True, none_ok=True,
        )  # fmt: skip
        check_real(self.header_timeout_s, "header_timeout_s", 0.0, MAX_TIMEOUT_S, low_open=True)
        check_real(self.keep_alive_s, "keep_alive_s", 0.0, MAX_TIMEOUT_S, low_open=True)
        check_real(self.send_timeout_s, "send_timeout_s", 0.0, MAX_TIMEOUT_S, low_open=True)
        check_real(self.linger_s, "linger_s", 0.0, MAX_TIMEOUT_S)
        check_int(self.max_header_bytes, "max_header_bytes", 1024)
        check_int(self.max_connections, "max_connections")
        check_int(self.health_connections, "health_connections", 0)
        check_int(self.retry_after_s, "retry_after_s")


def fit_to_file_limit(limits: ConnectionLimits) -> ConnectionLimits:
    """``limits`` with ``max_connections`` lowered to what ``RLIMIT_NOFILE`` allows.

    The soft limit is first raised towards the hard one; if the connections (plus the health
    ones and :data:`RESERVED_FILES`) still do not fit, ``max_connections`` shrinks, with a
    warning. Raises ``ValueError`` if not even one connection fits.
    """
    needed = limits.max_connections + limits.health_connections + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return limits
    fitted = soft - limits.health_connections - RESERVED_FILES
    if fitted < 1:
        raise ValueError(
            f"the file-descriptor limit ({soft}) leaves no room for connections; raise it "
            "(ulimit -n) or lower --health-connections"
        )
    logger.warning(
        "max_connections lowered to fit the file-descriptor limit",
        extra={"max_connections": fitted, "requested": limits.max_connections, "nofile": soft},
    )
    return replace(limits, max_connections=fitted)

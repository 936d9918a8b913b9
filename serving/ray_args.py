"""``serving.ray_deployment.build``'s arguments: from ``serve run``'s ``key=value`` strings (or
values from Python or YAML) to checked values, each bad one a ``ValueError`` naming it. No Ray
import: the arguments are checked where ``build`` runs, before any replica starts.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping
from typing import Any

from serving.ray_autoscaling import POLICY
from serving.settings import ConnectionLimits, ServerSettings, is_no_limit
from serving.shared_port import (
    CLOSE_GRACE_S,
    check_shared_host,
    migration_warning,
    reuse_port_supported,
)

__all__ = [
    "AUTOSCALING_ARGS",
    "LIMIT_ARGS",
    "autoscaling_config",
    "close_grace",
    "connection_limits",
    "number",
    "server_settings",
    "shared_port",
]

logger = logging.getLogger(__name__)


def number(args: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """``args[key]`` as ``kind`` (``serve run`` passes strings); ``ValueError`` naming it."""
    if key not in args:
        return default
    value = args[key]
    if kind is bool and isinstance(value, str):
        flags = {"true": True, "1": True, "false": False, "0": False}
        if value.lower() not in flags:
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return flags[value.lower()]
    if kind is tuple:  # allowed_hosts: comma-separated names
        return tuple(value.split(",")) if isinstance(value, str) else tuple(value)
    # from Python (or YAML), only a value of the kind: int(1.7), int(True) and bool(2) would
    # pass; a flag may be 1 or 0, as its string may
    if kind is bool and isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    expected = {int: (numbers.Integral,), float: (numbers.Real,)}.get(kind, ())
    if not isinstance(value, str) and (not isinstance(value, expected) or isinstance(value, bool)):
        raise ValueError(f"{key} must be {_KIND_NAMES[kind]}, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be {_KIND_NAMES[kind]}, got {value!r}") from None


_KIND_NAMES = {int: "an int", float: "a number", bool: "true or false", str: "a str"}


def server_settings(args: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ServerSettings`` fields among ``args``, converted to their fields' types."""
    kinds = {
        name: type(field.default) for name, field in ServerSettings.__dataclass_fields__.items()
    }
    kinds["allowed_hosts"] = tuple
    settings = {key: number(args, key, kind) for key, kind in kinds.items() if key in args}
    ServerSettings(**settings)  # bad settings fail here, not in every replica
    return settings


#: The shared port's connection limits that ``build`` takes by name (``ConnectionLimits`` fields,
#: as ``python -m serving``'s flags); ``retry_after_s`` is a server setting, for both 503s.
LIMIT_ARGS = tuple(
    name for name in ConnectionLimits.__dataclass_fields__ if name != "retry_after_s"
)


def connection_limits(args: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ConnectionLimits`` fields among ``args``, converted; only with ``shared_port``."""
    given = [key for key in LIMIT_ARGS if key in args]
    if given and "shared_port" not in args:
        raise ValueError(
            f"{given[0]} limits the shared port's connections: give shared_port too (Ray's "
            "ingress has its own)"
        )
    fields = ConnectionLimits.__dataclass_fields__
    limits = {}
    for key in given:
        optional = fields[key].default is None  # max_connection_age_s: None or "none", no limit
        if optional and is_no_limit(args[key]):
            limits[key] = None
        else:
            limits[key] = number(args, key, float if optional else type(fields[key].default))
    ConnectionLimits(**limits)  # bad limits fail here, not in every replica
    return limits


#: Ray Serve's ``AutoscalingConfig`` fields that ``build`` takes by name, with ``max_replicas``
#: (seconds; Ray's defaults: 30, 600, 10, 30). The delays may be 0; the intervals are > 0, and
#: the look-back longer than the interval. Ray 2.60 still reads ``metrics_interval_s`` (how often
#: a replica reports its metrics) but warns that a later release will take it from environment
#: variables instead (a ``DeprecationWarning`` where it is not 10).
AUTOSCALING_ARGS = (
    "upscale_delay_s", "downscale_delay_s", "metrics_interval_s", "look_back_period_s",
)  # fmt: skip


def autoscaling_config(args: Mapping[str, Any], shared: bool) -> dict[str, Any]:
    """Ray Serve's ``autoscaling_config`` from ``args`` (which hold ``max_replicas``); with a
    shared port, the policy that counts its requests too."""
    low = number(args, "min_replicas", int, 1)
    high = number(args, "max_replicas", int)
    if not 0 <= low <= high or high < 1:
        raise ValueError(
            f"min_replicas and max_replicas must be 0 <= min_replicas <= max_replicas and "
            f"max_replicas >= 1, got {low} and {high}"
        )
    if shared and low == 0:
        raise ValueError(
            "min_replicas must be >= 1 with shared_port: at 0 replicas nothing listens on the "
            "port, and Ray starts one only for a request its own ingress sees"
        )
    target = number(args, "target_ongoing_requests", float, 32.0)
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target_ongoing_requests must be a number > 0, got {target!r}")
    config: dict[str, Any] = {
        "min_replicas": low, "max_replicas": high, "target_ongoing_requests": target,
    }  # fmt: skip
    for key in AUTOSCALING_ARGS:
        if key in args:
            value = number(args, key, float)
            least = 0.0 if key.endswith("delay_s") else math.ulp(0.0)
            if not (math.isfinite(value) and value >= least):
                bound = ">= 0" if least == 0 else "> 0"
                raise ValueError(f"{key} must be a number of seconds {bound}, got {value!r}")
            config[key] = value
    interval = config.get("metrics_interval_s", 10.0)  # Ray's defaults
    look_back = config.get("look_back_period_s", 30.0)
    if look_back <= interval:
        raise ValueError(
            f"look_back_period_s must be longer than metrics_interval_s ({interval} s: a "
            f"replica's metrics arrive that often), got {look_back}"
        )
    if shared:
        config["policy"] = {"policy_function": POLICY}
        if (warning := migration_warning()) is not None:  # scale-downs will stop replicas
            logger.warning(warning)
    return config


def close_grace(args: Mapping[str, Any]) -> float:
    """``shared_close_grace_s`` (default :data:`CLOSE_GRACE_S`; only with ``shared_port``)."""
    if "shared_close_grace_s" in args and "shared_port" not in args:
        raise ValueError("shared_close_grace_s is the shared port's: give shared_port too")
    grace = number(args, "shared_close_grace_s", float, CLOSE_GRACE_S)
    if not 0 <= grace <= 5:  # counted within the listener's 15 s stop, itself within Ray's 20 s
        raise ValueError(f"shared_close_grace_s must be 0 to 5 seconds, got {grace!r}")
    return grace


def shared_port(args: Mapping[str, Any]) -> tuple[str, int] | None:
    """``(shared_host, shared_port)`` from ``args``, or ``None`` without ``shared_port``."""
    if "shared_port" not in args:
        if "shared_host" in args:
            raise ValueError("shared_host is the shared port's address: give shared_port too")
        return None
    port = number(args, "shared_port", int)
    if not 1 <= port <= 65535:
        raise ValueError(f"shared_port must be a TCP port, 1 to 65535, got {port!r}")
    if not reuse_port_supported():
        raise ValueError(
            "shared_port needs Linux: elsewhere SO_REUSEPORT does not spread the connections"
        )
    return check_shared_host(str(args.get("shared_host", "127.0.0.1"))), port

"""The validators that every module shares: integers, real numbers, flags, devices, cores.

Each check returns the value as a plain Python number (NumPy scalars from a grid built with
``np.arange`` become ``int`` / ``float``) or raises ``ValueError`` naming the parameter.
Torch-free and NumPy-free, so the serving side and the training side call the same code.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from pathlib import Path

__all__ = [
    "DEVICE_PATTERN",
    "FLOAT32_MAX",
    "MAX_THREADS",
    "check_bool",
    "check_int",
    "check_path",
    "check_real",
    "file_above",
    "parse_device",
    "usable_cores",
]

#: The most threads a caller may ask torch or onnxruntime for (``n_threads``,
#: ``intra_op_num_threads``): beyond the largest machines' cores, short of what breaks a process
#: (100,000 onnxruntime threads hung for minutes in 3 GB; torch's ran out of address space).
MAX_THREADS = 1024

#: The largest finite float32: the largest ``temperature`` (the graphs take it as float32; a
#: larger one would become infinite there, and torch's float32 arithmetic too).
FLOAT32_MAX = 3.4028234663852886e38

#: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(?::(\d+))?")


def check_bool(value: object, name: str, *, none_ok: bool = False) -> bool | None:
    """``value`` as a ``bool`` if it is one (NumPy's too), else ``ValueError`` naming ``name``:
    ``0``, ``"no"`` or ``"False"`` are not flags (``bool("no")`` is ``True``)."""
    if value is None and none_ok:
        return None
    kind = type(value)
    numpy_bool = kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")
    if isinstance(value, bool) or numpy_bool:
        return bool(value)
    allowed = "True, False or None" if none_ok else "True or False"
    raise ValueError(f"{name} must be {allowed}, got {value!r}"[:300])


def check_path(value: object, name: str, error: type[ValueError] = ValueError) -> Path:
    """``value`` as a ``Path`` if it is a ``str`` or ``os.PathLike``, else ``error`` (a
    ``ValueError``) naming ``name``: ``Path(1)`` and ``Path(b"x")`` fail inside pathlib with a
    ``TypeError`` that names neither."""
    if not isinstance(value, str | os.PathLike):
        raise error(f"{name} must be a str or os.PathLike, got {type(value).__name__}")
    return Path(value)


def file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it is not a folder (a file: ``path``
    cannot be made), else None."""
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    return parent if parent is not None and not parent.is_dir() else None


def check_int(
    value: object,
    name: str,
    minimum: int | None = 1,
    maximum: int | None = None,
    *,
    none_ok: bool = False,
) -> int | None:
    """``value`` as an ``int`` in ``[minimum, maximum]``, else ``ValueError`` naming ``name``.

    Booleans are refused (``True`` is an ``int`` to Python, never a size to a user); any
    ``numbers.Integral`` (NumPy integers included) is accepted. ``None`` passes when
    ``none_ok``.

    Examples
    --------
    >>> check_int(3, "window")
    3
    >>> check_int(0, "window")
    Traceback (most recent call last):
    ...
    ValueError: window must be an int >= 1, got 0
    """
    if value is None and none_ok:
        return None
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        if maximum is None:
            expected = "an int" if minimum is None else f"an int >= {minimum}"
        else:
            expected = f"an int in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {expected}{' or None' if none_ok else ''}, got {value!r}")
    return int(value)


def check_real(
    value: object,
    name: str,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    none_ok: bool = False,
) -> float | None:
    """``value`` as a finite ``float`` in the interval, else ``ValueError`` naming ``name``.

    ``low_open`` / ``high_open`` exclude the bound. Booleans, NaN and infinities are refused.

    Examples
    --------
    >>> check_real(0.5, "dropout", 0.0, 1.0, high_open=True)
    0.5
    """
    if value is None and none_ok:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = ok and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        extra = " or None" if none_ok else ""
        raise ValueError(f"{name} must be a finite float in {interval}{extra}, got {value!r}")
    return float(value)


def parse_device(device: object, name: str = "device") -> tuple[str, int | None]:
    """Split a device string into ``(kind, index)``: ``"cuda:1" -> ("cuda", 1)``.

    ``kind`` is ``"auto"``, ``"cpu"`` or ``"cuda"``; ``index`` is ``None`` unless given.
    Whether the device exists is for the caller (torch or onnxruntime) to say.
    """
    match = DEVICE_PATTERN.fullmatch(device) if isinstance(device, str) else None
    if match is None:
        raise ValueError(f"{name} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    index = match.group(1)
    return device.split(":")[0], None if index is None else int(index)


def _cgroup_quota(
    root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The CPU quota of this process in cores, or None: the smallest quota on the way from its
    cgroup (``membership``: ``/proc/self/cgroup``) up to the root of the hierarchy mounted at
    ``root``, since a quota on any ancestor (a systemd slice's ``CPUQuota=``, a container's)
    bounds it; cgroup v2's ``cpu.max``, else v1's ``cpu/cpu.cfs_quota_us`` over its period.
    Where the process's path is not under ``root`` (a container that mounts its own cgroup
    there without a cgroup namespace), ``root`` alone is read."""
    v2_path, v1_path = _cgroup_paths(membership)
    quotas = [_v2_quota(d) for d in _ancestors(root, v2_path)]
    if all(q is None for q in quotas):
        quotas = [_v1_quota(d) for d in _ancestors(root / "cpu", v1_path)]
    return min((q for q in quotas if q is not None), default=None)


def _cgroup_paths(membership: Path) -> tuple[str, str]:
    """This process's cgroup v2 path and its v1 ``cpu`` controller's path (``"/"`` if none)."""
    v2, v1 = "/", "/"
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return v2, v1
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def _ancestors(base: Path, path: str) -> list[Path]:
    """``base / path`` and each directory above it up to ``base`` (``base`` alone if that
    directory does not exist)."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:  # above the namespace's root (another cgroup namespace's): the root alone
        return [base]
    leaf = base.joinpath(*parts)
    if not leaf.is_dir():
        return [base]
    chain = [leaf]
    while chain[-1] != base:
        chain.append(chain[-1].parent)
    return chain


def _v2_quota(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cores(cgroup_root: str | os.PathLike = "/sys/fs/cgroup") -> int:
    """The cores this process may use: its CPU affinity mask, capped by its cgroup CPU quota.

    ``os.cpu_count()`` counts the machine's cores, which a container or ``taskset`` may not
    grant; thread pools sized by it oversubscribe. At least 1. ``cgroup_root`` is where the
    cgroup file system is mounted (``cpu.max`` for cgroup v2, ``cpu/cpu.cfs_*`` for v1); the
    quota is the smallest on the way from this process's cgroup up to that root.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = _cgroup_quota(Path(cgroup_root))
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)

"""The memory guard's limit: the default (from the memory available now) and ``memory_limit=`` values.

The guard (``einflow.engine.plan``) compares a plan's predicted peak, all arrays alive at once, with this limit
before anything is allocated.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from einflow.lang.errors import EinflowError

__all__ = ["address_space_available", "available_memory", "cgroup_available", "default_memory_limit",
           "format_bytes", "memory_limit_bytes"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_TEXT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as file:
            return file.read()
    except OSError:
        return None


def _stat(text: str | None, key: str) -> int:
    match = re.search(rf"^{key}\s+(\d+)", text or "", re.MULTILINE)
    return int(match.group(1)) if match else 0


def cgroup_available(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> int | None:
    """Bytes left under this process's container (cgroup) memory limit, or None when there is no limit.

    Reads cgroup v2 (``memory.max``, ``memory.current``) or v1 (``memory/memory.limit_in_bytes``,
    ``memory.usage_in_bytes``), in the process's own cgroup and at the root; the inactive page cache
    counts as free (the kernel reclaims it before it kills anything), as container runtimes count it.
    """
    own: dict[str, str] = {}
    for line in (_read(membership) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            own["v2" if parts[0] == "0" else parts[1]] = parts[2].strip().lstrip("/")
    found: list[int] = []
    for version, folder, limit_file, usage_file, cache_key in (
            ("v2", root, "memory.max", "memory.current", "inactive_file"),
            ("memory", os.path.join(root, "memory"), "memory.limit_in_bytes", "memory.usage_in_bytes",
             "total_inactive_file")):
        for place in dict.fromkeys((os.path.join(folder, own.get(version, "")), folder)):
            limit = (_read(os.path.join(place, limit_file)) or "").strip()
            if not limit.isdigit() or int(limit) >= 1 << 60:  # "max", or v1's "unlimited" (a huge number)
                continue
            usage = int((_read(os.path.join(place, usage_file)) or "0").strip() or 0)
            cache = _stat(_read(os.path.join(place, "memory.stat")), cache_key)
            found.append(max(int(limit) - max(usage - cache, 0), 0))
    return min(found) if found else None


def address_space_available(status: str = "/proc/self/status") -> int | None:
    """Bytes of address space left under this process's RLIMIT_AS (``ulimit -v``), or None when unlimited.

    The limit counts the address space mapped (VmSize), not the memory touched: a plan over it would end in
    a raw MemoryError from numpy.

    >>> address_space_available() is None or address_space_available() >= 0
    True
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    match = re.search(r"^VmSize:\s+(\d+)\s*kB", _read(status) or "", re.MULTILINE)
    used = int(match.group(1)) * 1024 if match else 0
    return max(soft - used, 0)


def available_memory() -> int:
    """Bytes this process can still allocate: MemAvailable, lowered to the cgroup's remaining limit and to the
    address space left under RLIMIT_AS, where those are set."""
    found: list[int] = []
    meminfo = _read("/proc/meminfo")
    if meminfo is not None:
        match = re.search(r"^MemAvailable:\s+(\d+)\s*kB", meminfo, re.MULTILINE)
        if match:
            found.append(int(match.group(1)) * 1024)
    for bound in (cgroup_available(), address_space_available()):
        if bound is not None:
            found.append(bound)
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
            found.append(8 << 30)
    return min(found)


def default_memory_limit() -> int:
    """The default limit: 90% of the memory available when a plan is made (see :func:`available_memory`)."""
    return int(available_memory() * 0.9)


def memory_limit_bytes(value: Any) -> int | float | None:
    """``memory_limit=`` as bytes: a number, a string such as ``"1GB"``, ``"512 MiB"``, ``"default"``, or None (off).

    >>> memory_limit_bytes("1.5 GiB"), memory_limit_bytes(1000), memory_limit_bytes(None)
    (1610612736, 1000, None)
    """
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == "default":
            return default_memory_limit()
        match = _TEXT.match(value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise EinflowError(f"memory_limit={value!r} is not a size: write bytes as a number or a string like "
                               "'1GB', '512 MiB' (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), or None for no limit")
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EinflowError(f"memory_limit= must be a number of bytes, a string like '1GB', 'default' or None, not "
                           f"{type(value).__name__}")
    if math.isnan(value) or value < 0:
        raise EinflowError(f"memory_limit={value!r} is not a size: give a number of bytes >= 0, or None for no limit")
    return value


def format_bytes(count: float) -> str:
    """Bytes for people, in powers of 1024 with three significant digits (the one formatter einflow prints with).

    >>> format_bytes(1000), format_bytes(3 * 1024**3), format_bytes(1000 * 1024), format_bytes(31981568)
    ('1000 B', '3 GiB', '1000 KiB', '30.5 MiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(count)} B"
            return f"{count:.0f} {unit}" if abs(count) >= 1000 else f"{count:.3g} {unit}"
        count /= 1024
    raise AssertionError("unreachable")  # pragma: no cover

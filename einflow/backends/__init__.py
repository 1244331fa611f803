"""Backend registry: numpy (default), cupy, dask; ``auto`` picks from the input arrays."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from einflow.backends.base import Backend
from einflow.errors import BackendError

__all__ = ["Backend", "get_backend", "infer_backend", "set_backend", "get_default_backend", "BACKENDS"]

_FACTORIES: dict[str, tuple[str, Callable[[], Backend]]] = {}
_LOADED: dict[str, Backend] = {}
_default = "auto"

BACKENDS = ("numpy", "cupy", "dask", "auto")
_INSTALL = {
    "numpy": "pip install numpy",
    "cupy": "pip install 'einflow[cupy]' (a CUDA GPU is required)",
    "dask": "pip install 'einflow[dask]'",
}


def _register(name: str, module: str, attribute: str) -> None:
    def factory() -> Backend:
        import importlib

        return getattr(importlib.import_module(module), attribute)()

    _FACTORIES[name] = (module, factory)


_register("numpy", "einflow.backends.numpy_backend", "NumpyBackend")
_register("cupy", "einflow.backends.cupy_backend", "CupyBackend")
_register("dask", "einflow.backends.dask_backend", "DaskBackend")


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (imported on first use)."""
    backend = _LOADED.get(name)
    if backend is not None:
        return backend
    if name not in _FACTORIES:
        raise BackendError(f"backend {name!r} not found, valid options are {set(BACKENDS)}")
    try:
        backend = _FACTORIES[name][1]()
    except ImportError as error:
        raise BackendError(
            f"backend {name!r} is not available ({error}); install it with: {_INSTALL[name]}; "
            f"valid options are {set(BACKENDS)}"
        ) from None
    _LOADED[name] = backend
    return backend


def infer_backend(values: Iterable[Any]) -> str:
    """``auto``: any dask array -> dask; any cupy array -> cupy; otherwise numpy."""
    found = "numpy"
    for value in values:
        module = type(value).__module__
        if module.startswith("numpy") or module == "builtins":
            continue
        if module.startswith("dask"):
            return "dask"
        if module.startswith("cupy"):
            found = "cupy"
    return found


def set_backend(name: str) -> None:
    """Set the process-wide default backend (``auto`` unless changed).

    >>> set_backend("numpy"); set_backend("auto")
    """
    global _default
    if name not in BACKENDS:
        raise BackendError(f"backend {name!r} not found, valid options are {set(BACKENDS)}")
    if name != "auto":
        get_backend(name)
    _default = name


def get_default_backend() -> str:
    """The process-wide default backend name."""
    return _default


def is_imported(module: str) -> bool:
    """Whether the user already imported ``module`` (backends never import a library by surprise)."""
    return module in sys.modules

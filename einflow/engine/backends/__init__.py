"""Backend registry: numpy (default), cupy, dask, torch, jax; ``auto`` picks from the input arrays."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from einflow.engine.backends.base import Backend
from einflow.lang.errors import BackendError

__all__ = ["Backend", "get_backend", "infer_backend", "set_backend", "get_default_backend", "BACKENDS"]

BACKENDS = ("numpy", "cupy", "dask", "torch", "jax", "auto")
# name -> (module, class); a module is imported only when its backend is first asked for
_MODULES = {
    "numpy": ("einflow.engine.backends.numpy_backend", "NumpyBackend"),
    "cupy": ("einflow.engine.backends.cupy_backend", "CupyBackend"),
    "dask": ("einflow.engine.backends.dask_backend", "DaskBackend"),
    "torch": ("einflow.engine.backends.torch_backend", "TorchBackend"),
    "jax": ("einflow.engine.backends.jax_backend", "JaxBackend"),
}
_INSTALL = {
    "numpy": "pip install numpy",
    "cupy": "pip install 'einflow[cupy]' (needs a CUDA 12 GPU)",
    "dask": "pip install 'einflow[dask]'",
    "torch": "pip install torch",
    "jax": "pip install 'jax[cpu]'",
}
_LOADED: dict[str, Backend] = {}
_default = "auto"


def _choices() -> str:
    installs = "; ".join(f"{name}: {_INSTALL[name]}" for name in ("dask", "cupy", "torch", "jax"))
    return f"valid options are {', '.join(repr(name) for name in BACKENDS)} (to install: {installs})"


def get_backend(name: str) -> Backend:
    """The backend called ``name``, importing its library on first use.

    >>> get_backend("numpy").name
    'numpy'
    """
    backend = _LOADED.get(name)
    if backend is not None:
        return backend
    if name not in _MODULES:
        raise BackendError(f"backend {name!r} not found, {_choices()}")
    module, attribute = _MODULES[name]
    try:
        backend = getattr(importlib.import_module(module), attribute)()
    except ImportError as error:
        raise BackendError(f"backend {name!r} is not available ({error}); install it with: {_INSTALL[name]}") \
            from None
    _LOADED[name] = backend
    return backend


#: array libraries whose arrays pick their backend under ``auto`` (module prefix -> backend)
_FRAMEWORKS = (("torch", "torch"), ("jax", "jax"), ("jaxlib", "jax"))


def infer_backend(values: Iterable[Any]) -> str:
    """``auto``: the backend of the array library the inputs come from (no library is imported).

    torch tensors -> torch; jax arrays (tracers included) -> jax; any dask array -> dask; any cupy array
    -> cupy; otherwise numpy. numpy arrays, lists and Python numbers join any of them. Arrays of two
    frameworks (torch with jax, dask or cupy; jax with dask or cupy) are a BackendError.

    >>> infer_backend([1.0, [2, 3]])
    'numpy'
    """
    found: set[str] = set()
    for value in values:
        module = type(value).__module__
        for prefix, backend in _FRAMEWORKS:
            if module == prefix or module.startswith(prefix + "."):
                found.add(backend)
                break
        else:
            if module.startswith("dask"):
                found.add("dask")
            elif module.startswith("cupy"):
                found.add("cupy")
    frameworks = found & {"torch", "jax"}
    if frameworks and len(found) > 1:
        raise BackendError(f"the inputs mix arrays of {' and '.join(sorted(found))}; einflow returns the inputs' "
                           "own array type, so pass arrays of one library (numpy arrays and Python numbers "
                           "may join any)")
    if frameworks:
        return frameworks.pop()
    if "dask" in found:
        return "dask"
    return "cupy" if "cupy" in found else "numpy"


def set_backend(name: str, **settings: Any) -> None:
    """Set the process-wide default backend (``auto`` unless changed) and, optionally, its settings.

    >>> set_backend("numpy"); get_default_backend()
    'numpy'
    >>> set_backend("auto")
    """
    global _default
    if name not in BACKENDS:
        raise BackendError(f"backend {name!r} not found, {_choices()}")
    if name == "auto":
        if settings:
            raise BackendError("'auto' has no settings; give them with the backend's own name")
    else:
        get_backend(name).configure(**settings)
    _default = name


def get_default_backend() -> str:
    """The process-wide default backend name.

    >>> get_default_backend()
    'auto'
    """
    return _default


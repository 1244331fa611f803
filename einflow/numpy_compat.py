"""``einsum(subscripts, *arrays)``: numpy's subscripts syntax, planned by opt_einsum and cached."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import opt_einsum as oe
from opt_einsum.parser import parse_einsum_input

from einflow.backends import get_backend, infer_backend
from einflow.errors import EinflowError, ShapeError
from einflow.kernels import compile_numpy

__all__ = ["einsum"]


@functools.lru_cache(maxsize=1024)
def _expression(subscripts: str, shapes: tuple[tuple[int, ...], ...], optimize: Any) -> tuple[Any, Any, str]:
    class _Shaped:
        def __init__(self, shape: tuple[int, ...]) -> None:
            self.shape = shape

    strange = [c for c in subscripts if not (c.isascii() and c.isalpha()) and c not in ",.->"]
    if strange:
        raise EinflowError(f"invalid einsum subscripts {subscripts!r}: {strange[0]!r} is not a letter (subscripts are "
                           "the letters a-z and A-Z, with ',', '->' and '...')")
    try:
        inputs, output, _ = parse_einsum_input([subscripts, *[_Shaped(s) for s in shapes]])
    except (ValueError, IndexError, TypeError) as error:
        raise EinflowError(f"invalid einsum subscripts {subscripts!r}: {error}") from None
    equation = f"{inputs}->{output}"
    terms = inputs.split(",")
    if len(terms) != len(shapes):
        raise EinflowError(f"subscripts {subscripts!r} name {len(terms)} operands but {len(shapes)} were given")
    sizes: dict[str, tuple[int, int]] = {}
    for position, (term, shape) in enumerate(zip(terms, shapes)):
        if len(term) != len(shape):
            raise ShapeError(f"operand {position} has rank {len(shape)} (shape {shape}) but subscripts "
                             f"'{term}' name {len(term)} axes")
        for letter, size in zip(term, shape):
            known = sizes.setdefault(letter, (size, position))
            if known[0] != size and 1 not in (known[0], size):
                raise ShapeError(f"index '{letter}' has size {known[0]} in operand {known[1]} but size {size} in "
                                 f"operand {position}")
    try:
        _, info = oe.contract_path(equation, *shapes, shapes=True, optimize=optimize)
        expression = oe.contract_expression(equation, *shapes, optimize=info.path)
    except (ValueError, KeyError, TypeError) as error:  # e.g. a subscript that is not a letter
        raise EinflowError(f"invalid einsum subscripts {subscripts!r}: {error}") from None
    # numpy arrays run the same path as direct numpy.dot/matmul/einsum steps (einflow.kernels)
    compiled, _ = compile_numpy(equation, shapes, info.contraction_list)
    return expression, compiled, equation


def einsum(subscripts: str, *operands: Any, optimize: Any = "auto") -> Any:
    """numpy.einsum's interface (implicit mode, ``->``, ``...``, repeated letters), planned by opt_einsum.

    >>> import numpy as np, einflow as ef
    >>> ef.einsum("ij,jk", np.eye(2), np.ones((2, 3))).shape
    (2, 3)
    >>> float(ef.einsum("ii", np.eye(3)))
    3.0
    """
    if not isinstance(subscripts, str):
        raise EinflowError("einsum expects a subscripts string first, e.g. einsum('ij,jk->ik', a, b)")
    arrays = [op if hasattr(op, "shape") else np.asarray(op) for op in operands]
    shapes = tuple(tuple(a.shape) for a in arrays)
    expression, compiled, equation = _expression(subscripts.replace(" ", ""), shapes, optimize)
    plain = all(type(a) is np.ndarray for a in arrays)
    if not plain:
        # the rule Program.__call__ follows: the inputs' array library picks the backend (mixing two is an error)
        name = infer_backend(arrays)
        if name in ("torch", "jax"):
            engine = get_backend(name)
            device = next((a.device for a in arrays if type(a).__module__.startswith("torch")), None)
            converted = [engine.asarray(a, device=device) if name == "torch" else engine.asarray(a) for a in arrays]
            return expression(*converted, backend=engine.einsum_backend)
    if len(arrays) == 1 and "..." not in subscripts:
        # a single operand: numpy's own einsum returns views for transposes and diagonals, like numpy
        return np.einsum(equation, arrays[0]) if plain else expression(*arrays)
    result = compiled(*arrays) if plain else expression(*arrays)
    if type(result) is np.ndarray and result.ndim == 0:
        return result[()]  # numpy.einsum gives a numpy scalar, not a 0-d array, for a full contraction
    return result

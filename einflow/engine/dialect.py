"""The array dialects generated code is written in: each a value of facts the render rows read.

A dialect is what differs between array libraries' spellings of the same computation (numpy's
``x.transpose(axes)`` is torch's ``x.permute(axes)``) and between what they allow (numpy writes through a
strided diagonal view; torch and jax do not). The render rows read these fields; none compares a name.
A backend carries the dialect its code is written in (``Backend.dialect``); ``to_source(target=...)`` looks
one up by name in :data:`DIALECTS`.

>>> TORCH.permute, NUMPY.permute
('permute', 'transpose')
>>> dialect_named("jax").module
'jax.numpy'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["Dialect", "NUMPY", "TORCH", "JAX", "DIALECTS", "dialect_named"]


@dataclass(frozen=True, eq=False)
class Dialect:
    """One array library's spellings and rules, as the generated code needs them.

    ``name``: the ``to_source`` target naming it; ``module``: the module exported source imports;
    ``permute``: the method reordering an array's axes; ``power``: the function raising to a power;
    ``axis``: the keyword of a reduction's axes; ``cast``: the text converting ``{x}`` to numpy's dtype
    ``{dtype}`` (``{np}`` the array module); ``calls``: function templates that differ from
    ``einflow.lang.functions`` ones; ``typed_literals``: numbers are written as 0-d arrays of numpy's default
    types (torch widens by them as numpy does by Python numbers); ``devices``: new arrays are put on the
    inputs' device; ``strided_writes``: the code may write through a strided view (``np.einsum`` of an
    output); ``numpy_types``: the library computes numpy's result types (else operands are cast to them);
    ``in_place``: elementwise work on an array the step just made may be done in place;
    ``stored_orders``: operations keep their operands' memory layouts (contractions read operands in the
    order they are stored); ``promoting_contract``: contractions go through the ``contract`` helper, which
    brings operands to numpy's common type first; ``floats_before_division``: integer arrays are promoted to
    float64 before ``/`` (torch divides them in float32); ``kernel_spelling``: (numpy text, this dialect's
    text) replacements of ``einflow.engine.kernels``' pairwise calls; ``runtime``: the module whose functions override
    ``einflow.engine.runtime_numpy``'s table of operations for this dialect (None: none do).
    """

    name: str
    module: str
    permute: str = "transpose"
    power: str = "power"
    axis: str = "axis"
    cast: str = "{x}.astype({dtype!r})"
    calls: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    typed_literals: bool = False
    devices: bool = False
    strided_writes: bool = True
    numpy_types: bool = True
    in_place: bool = False
    stored_orders: bool = False
    promoting_contract: bool = False
    floats_before_division: bool = False
    kernel_spelling: tuple[tuple[str, str], ...] = ()
    runtime: str | None = None
    #: an elementwise product summed that keeps only batch indices is a batched matmul (not one einsum pass:
    #: numpy's matmul on 1 x K stacks copies an operand whose summed axes are not last)
    batched_sums_by_matmul: bool = False

    def __repr__(self) -> str:
        return f"Dialect({self.name!r})"


#: numpy, and the libraries that follow its API (cupy, dask.array)
NUMPY = Dialect(name="numpy", module="numpy")

#: PyTorch: ``torch.maximum`` takes two tensors (``relu`` is a clamp), integer tensors divide in float32
TORCH = Dialect(
    name="torch", module="torch", permute="permute", power="pow", axis="dim", cast="{x}.to({np}.{dtype})",
    calls=MappingProxyType({"relu": "{np}.clamp({x}, min=0)", "sign": "{sign}({x})",
                            "softplus": "{np}.logaddexp({np}.zeros_like({x}), {x})"}),
    typed_literals=True, devices=True, strided_writes=False, numpy_types=False, in_place=True,
    stored_orders=True, promoting_contract=True, floats_before_division=True,
    # numpy.dot of 2-D and 1-D operands is matmul; products go through einflow.engine.backends.torch_ops
    # (``_ops``: mixed dtypes brought to numpy's common type first)
    kernel_spelling=(("_np.dot(", "_ops.matmul("), ("_np.matmul(", "_ops.matmul("), ("_np.einsum(", "_ops.einsum("),
                     (".transpose(", ".permute(")), runtime="einflow.engine.runtime_torch",
    batched_sums_by_matmul=True)

#: jax.numpy: numpy's spellings on immutable arrays (diagonals are written with ``.at[...].set``)
JAX = Dialect(name="jax", module="jax.numpy", strided_writes=False, numpy_types=False,
              runtime="einflow.engine.runtime_jax")

#: the dialects by name (``to_source``'s targets)
DIALECTS: Mapping[str, Dialect] = MappingProxyType({dialect.name: dialect for dialect in (NUMPY, TORCH, JAX)})


def dialect_named(name: str) -> Dialect:
    """The dialect called ``name``; a helpful error listing the valid ones otherwise."""
    found = DIALECTS.get(name)
    if found is None:
        raise ValueError(f"unknown target {name!r}, valid options are {sorted(DIALECTS)}")
    return found

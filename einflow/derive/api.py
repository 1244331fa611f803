"""The derivative programs themselves (grad, jacobian, hessian, vjp, jvp, hvp, ...): checked IR in, checked IR out."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from einflow.derive.batch import batch_names, follow, restore, strip, summed_batch
from einflow.derive.conjugate import hermitian_inputs
from einflow.derive.normal import (
    rename,
    rename_apart,
)
from einflow.derive.rules import Leaf, input_leaf
from einflow.derive.samples import expanded, sample_indices, value_indices, value_name, with_name
from einflow.derive.schedule import on_demand
from einflow.derive.setup import Setup, mark_missing_targets
from einflow.derive.shifts import with_shifts
from einflow.derive.simplify import is_zero
from einflow.derive.simplify import simplify as simplified  # (the module keeps the name simplify here)
from einflow.derive.sizes import IndexSizes, activated
from einflow.derive.sweep import forward_sweep, reverse_sweep, tangent_sweep, zeros
from einflow.derive.taylor import laplacian_sweep, taylor_sweep
from einflow.derive.taylor_collapsed import bilaplacian_sweep
from einflow.lang import ir
from einflow.lang.check import Checked, check_name, checked
from einflow.lang.errors import DerivativeError, EinflowError
from einflow.lang.indices import indices_in
from einflow.lang.padding import declare_pads, without_pads

__all__ = ["grad", "jacobian", "hessian", "wirtinger_hessian",
           "hessian_diagonal", "laplacian", "bilaplacian", "taylor", "vjp", "jvp",
           "hvp", "value_and_grad"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _deriving(function: _F) -> _F:
    """Run a derivation with its own index-size registry (consulted by renaming and simplification)."""

    @functools.wraps(function)
    def derive(*args, **kwargs):  # type: ignore[no-untyped-def]
        def run(program, *rest, **options):  # type: ignore[no-untyped-def]
            with activated(IndexSizes()):
                return function(program, *rest, **options)

        program = _declarations_first(args[0])
        padded = isinstance(program, Checked) and program.ir != without_pads(program.ir)
        if padded:  # the reads and deltas carry their modes; the declarations are written anew from them
            program = checked(without_pads(program.ir))
        result = with_shifts(run, program, args[1:], kwargs)  # einflow.derive.shifts
        return checked(declare_pads(result.ir)) if padded else result

    return derive  # type: ignore[return-value]


def _declarations_first(program: Any) -> Any:
    """The program with the declarations after its last statement moved before it (LANGUAGE.md: declarations
    stand anywhere): a trailing ``spd``/``symmetric`` line declares the same matrices there, and a trailing
    ``size`` line sizes no statement, so it goes."""
    if not isinstance(program, Checked):
        return program
    statements = program.ir.statements
    last = max((k for k, s in enumerate(statements) if isinstance(s, (ir.Assign, ir.Return))), default=len(statements))
    if last >= len(statements) - 1:
        return program
    trailing = [s for s in statements[last + 1:] if isinstance(s, ir.MatrixDecl)]
    if isinstance(statements[last], ir.Return):  # a return line stays last, after its statement
        last = max((k for k, s in enumerate(statements[:last]) if isinstance(s, ir.Assign)), default=last)
        moved = (*statements[:last], *trailing, *statements[last:last + 2])
    else:
        moved = (*statements[:last], *trailing, statements[last])
    return checked(ir.ProgramIR(moved))


def _wrt_list(program: Checked, wrt: str | Sequence[str], what: str) -> tuple[list[str], bool]:
    if isinstance(wrt, str):
        names = [wrt]
    elif isinstance(wrt, (list, tuple)):
        names = list(wrt)
    else:
        raise DerivativeError(f"{what}: wrt= must name an input or list input names, got {wrt!r} "
                              f"(inputs: {', '.join(program.info.inputs) or 'none'})")
    if not names:
        raise DerivativeError(f"{what}: wrt= names no tensor")
    for name in names:
        if not isinstance(name, str):
            raise DerivativeError(f"{what}: wrt= must be tensor names, got {name!r}")
        if name not in program.info.inputs:
            if name in program.info.targets:
                raise DerivativeError(
                    f"{what}: '{name}' is computed by the program, not an input; derivatives are taken with "
                    f"respect to inputs ({', '.join(program.info.inputs)})")
            raise DerivativeError(f"{what}: wrt='{name}' is not an input of the program (inputs: "
                                  f"{', '.join(program.info.inputs) or 'none'})")
    if len(set(names)) != len(names):
        raise DerivativeError(f"{what}: wrt= names a tensor twice")
    return names, not isinstance(wrt, str)


def _zero_derivative(of: ir.Assign, fresh_axes: tuple[str, ...]) -> ir.Assign:
    """The derivative of ``of``'s target by an input it does not depend on: exact zeros of the right shape."""
    indices = (of.indices or ()) + fresh_axes
    assert of.target is not None
    return ir.Assign(of.target, indices, zeros(indices))


def _gradient_names(setup: Setup, wrt: list[str]) -> dict[str, str]:
    names = {x: f"d{setup.value}_d{x}" for x in wrt}
    names["value"] = setup.value
    return names


@_deriving
def grad(program: Checked, wrt: str | Sequence[str]) -> Checked:
    """The gradient of a scalar program, as a new program (a tuple of gradients when ``wrt`` is a list).

    >>> import numpy as np, einflow as ef
    >>> g = ef.grad("f = x[i] x[i]", wrt="x")
    >>> print(g)
    size p = x
    df_dx[p] = 2 x[p]
    >>> g(x=np.array([1.0, 2.0])).tolist()
    [2.0, 4.0]
    """
    hint = "; use jacobian(...) for the full derivative or vjp(..., cotangent=...) to contract it with a cotangent"
    _, setup, names, as_tuple, outputs = _reverse(program, wrt, "grad", hint)
    return setup.assemble([outputs[x] for x in names], as_tuple)


def _reverse(program: Checked, wrt: str | Sequence[str], what: str, hint: str = "",
             ) -> tuple[Checked, Setup, list[str], bool, dict[str, Any]]:
    """The program, its setup, the ``wrt`` names, whether they were a list, and the gradient of the program's
    scalar value by each (a reverse sweep); ``hint`` ends the error for a value that is not a scalar."""
    names, as_tuple = _wrt_list(program, wrt, what)
    setup = Setup(program, what)
    if setup.value_rank:
        raise DerivativeError(f"{what} needs a scalar value, but '{setup.value}' has rank {setup.value_rank}{hint}")
    # complex inputs (LANGUAGE.md 9.2): the sweep's adjoints are jax's, conj(dL/dRe z + i dL/dIm z); the gradient
    # is their conjugate (PyTorch's). A holomorphic program has a real value for real inputs only, where the
    # two agree: its gradient needs no conj.
    gradients = reverse_sweep(setup.work, setup.value, ir.Num(1), names, _gradient_names(setup, names),
                              conjugate_result=setup.obstacle is not None)
    return program, setup, names, as_tuple, gradients


@_deriving
def value_and_grad(program: Checked, wrt: str | Sequence[str]) -> Checked:
    """One program computing the value and its gradient(s) with shared work; its call returns ``(value, grad)``.

    >>> import numpy as np, einflow as ef
    >>> value, gradient = ef.value_and_grad("f = x[i] x[i]", wrt="x")(x=np.array([1.0, 2.0]))
    >>> float(value), gradient.tolist()
    (5.0, [2.0, 4.0])
    """
    _, setup, names, _, outputs = _reverse(program, wrt, "value_and_grad", "; use jacobian(...) or vjp(...)")
    return setup.assemble([setup.value] + [outputs[x] for x in names], True)


@_deriving
def vjp(program: Checked, wrt: str | Sequence[str], cotangent: str = "G") -> Checked:
    """The cotangent ``cotangent`` (a new input with the value's shape) pulled back to ``wrt``.

    >>> import numpy as np, einflow as ef
    >>> v = ef.vjp("y[i] = A[i,j] x[j]", wrt="x", cotangent="g")
    >>> print(v)
    size p = x
    vjp_x[p] = g[i] conj(A[i,p])
    """
    names, as_tuple = _wrt_list(program, wrt, "vjp")
    setup = Setup(program, "vjp")
    _new_input(program, cotangent, "vjp", "cotangent")
    setup.tensor_names.take(cotangent)
    output = setup.work.target(setup.value)
    assert output is not None
    setup.work.ranks[cotangent] = setup.value_rank
    seed: ir.Expr = ir.Tensor(cotangent, output.indices or ())
    gradient_names = {x: f"vjp_{x}" for x in names}
    gradient_names["value"] = setup.value
    # vjp(G) is the gradient of Re(sum conj(G) f) (LANGUAGE.md 9.2): conj(J) G for a holomorphic program;
    # otherwise the sweep's (jax's) adjoints of conj(G), conjugated
    holomorphic = setup.obstacle is None
    if not holomorphic:
        seed = ir.Call("conj", seed)
    outputs = reverse_sweep(setup.work, setup.value, seed, names, gradient_names, conjugate_jacobian=holomorphic,
                            conjugate_result=not holomorphic)
    return setup.assemble([outputs[x] for x in names], as_tuple)


@_deriving
def _jacobian(program: Checked, wrt: str | Sequence[str], mode: str = "auto") -> Checked:
    """The full derivative: shape = value's shape + ``wrt``'s shape (a tuple for a list of ``wrt``).

    ``mode``: ``"forward"`` carries tangents (the input's axes) through the statements, ``"reverse"``
    carries adjoints (the value's axes); ``"auto"`` carries whichever has fewer axes.

    >>> import einflow as ef
    >>> print(ef.jacobian("y[i] = tanh(x[i])", wrt="x"))
    y[i] = tanh(x[i])
    dy_dx[i,p] = delta[i,p] (1 - y[i]^2)
    """
    names, as_tuple = _wrt_list(program, wrt, "jacobian")
    setup = Setup(program, "jacobian")
    work = setup.work
    if mode == "auto":
        # carry the smaller side through the program: the value's axes (reverse) or the input's (forward)
        mode = "reverse" if setup.value_rank < min(work.ranks[x] for x in names) else "forward"
    if mode not in ("forward", "reverse"):
        raise DerivativeError(f"jacobian: mode={mode!r} not found, valid options are {{'auto', 'forward', 'reverse'}}")
    if mode == "reverse":
        value = work.target(setup.value)
        assert value is not None
        axes = work.fresh_indices(setup.value)
        seed = ir.product(ir.Num(1), *(ir.Delta(t, o) for t, o in zip(value.indices or (), axes)))
        gradient_names = {x: f"d{setup.value}_d{x}" for x in names}
        gradient_names["value"] = setup.value
        outputs_by = reverse_sweep(work, setup.value, seed, names, gradient_names, extra=axes)
        return setup.assemble([outputs_by[x] for x in names], as_tuple)
    forward_targets = [s.target for s in work.statements if s.target]
    outputs = []
    for x in names:
        results, fresh_axes = forward_sweep(work, x, forward_targets, [setup.value])
        name = work.tensor_fresh.pick([f"d{setup.value}_d{x}"], f"d_{x}")
        value = work.target(setup.value)
        assert value is not None
        statement = results.get(setup.value) or _zero_derivative(value, fresh_axes)
        work.statements.append(ir.Assign(name, statement.indices, statement.expr))
        outputs.append(name)
    return setup.assemble(outputs, as_tuple)


@_deriving
def _hessian(program: Checked, wrt: str | Sequence[str]) -> Checked:
    """Second derivatives of a scalar program: shape = ``wrt``'s shape twice (blocks for a list of ``wrt``).

    Forward-over-reverse: the gradient program's statements are differentiated forward.

    >>> import einflow as ef
    >>> print(ef.hessian("f = x[i] x[i]", wrt="x"))
    size p = x
    size q = x
    d2f_dx2[p,q] = 2 delta[p,q]
    """
    setup, names, as_tuple, blocks = _second_derivatives(program, wrt, "hessian", every_pair=True)
    work = setup.work
    outputs = []
    for (first, second), statement in blocks.items():
        block = f"d2{setup.value}_d{first}2" if first == second else f"d2{setup.value}_d{first}d{second}"
        name = work.tensor_fresh.pick([block], f"d2_{first}_{second}")
        work.statements.append(ir.Assign(name, statement.indices, statement.expr))
        outputs.append(name)
    return setup.assemble(outputs, as_tuple)


def _diagonal(statement: ir.Assign, rank: int) -> ir.Assign:
    """A second-derivative statement ``d[p,q,v,w]`` (first the gradient's axes, then the forward sweep's) read
    on its diagonal, ``d[p,q,p,q]``: the second axes renamed to the first in the right side, which is then
    computed directly (no statement holds the whole Hessian)."""
    indices = statement.indices or ()
    first, second = indices[:rank], indices[rank:]
    assert len(second) == rank
    # (indices bound inside get new names first, so that none of them is caught by the renaming)
    expr = simplified(rename(rename_apart(statement.expr), dict(zip(second, first))))  # delta[p,p] = 1, x[p] - x[p] = 0
    return ir.Assign(statement.target, first, expr)


def _second_derivatives(program: Checked, wrt: str | Sequence[str], what: str, every_pair: bool = False,
                        ) -> tuple[Setup, list[str], bool, dict[tuple[str, str], ir.Assign]]:
    """The setup, the ``wrt`` names, whether they were a list, and the second-derivative statements
    d2L/dXdY (the gradient's axes first, by X; then Y's), derived forward over reverse, for every pair of
    names in order (``every_pair``) or for (X, X) alone; the statements are not yet added to the work."""
    _, setup, names, as_tuple, gradients = _reverse(program, wrt, what)
    work = setup.work
    through = [s.target for s in work.statements if s.target]
    blocks = {}
    for first in names:
        for second in names if every_pair else [first]:
            results, fresh_axes = forward_sweep(work, second, through, [gradients[first]])
            gradient_statement = work.target(gradients[first])
            assert gradient_statement is not None
            blocks[first, second] = results.get(gradients[first]) or _zero_derivative(gradient_statement, fresh_axes)
    return setup, names, as_tuple, blocks


@_deriving
def _hessian_diagonal(program: Checked, wrt: str | Sequence[str]) -> Checked:
    """The diagonal of the Hessian of a scalar program, shaped like ``wrt`` (a list: one per input), without
    forming the Hessian: the second-derivative statement is read on its diagonal, so its intermediates are
    those of the Hessian's own statements.

    >>> import numpy as np, einflow as ef
    >>> d = ef.hessian_diagonal("f = sum[i](exp(A[i,j] x[j]))", wrt="x")
    >>> print(d)
    t1[i] = exp(A[i,j] x[j])
    size p = x
    d2f_dx2_diag[p] = A[i,p]^2 t1[i]
    >>> d(A=np.array([[1.0, 2.0], [3.0, 0.0]]), x=np.zeros(2)).tolist()
    [10.0, 4.0]
    """
    setup, names, as_tuple, blocks = _second_derivatives(program, wrt, "hessian_diagonal")
    outputs = []
    for x in names:
        statement = _diagonal(blocks[x, x], setup.work.ranks[x])
        name = setup.work.tensor_fresh.pick([f"d2{setup.value}_d{x}2_diag"], f"d2_{x}_diag")
        setup.work.statements.append(ir.Assign(name, statement.indices, statement.expr))
        outputs.append(name)
    return setup.assemble(outputs, as_tuple)


@_deriving
def _laplacian(program: Checked, wrt: str | Sequence[str], weights: str | None = None) -> Checked:
    """The Laplacian of a scalar program, the sum of its second derivatives by each element of ``wrt`` (a
    list: by the elements of all of them), the trace of the Hessian without forming it: a forward sweep
    carries each statement's first derivatives along every direction and its Laplacian summed over them
    (einflow.derive.taylor), about the cost of D + 2 forward passes for D directions.

    >>> import numpy as np, einflow as ef
    >>> lap = ef.laplacian("f = x[i] x[i] y + y^3", wrt=["x", "y"])
    >>> print(lap)
    size p = x
    laplacian_f = 2 delta[p,p] y + 6 y
    >>> float(lap(x=np.ones(3), y=2.0))  # 2 y per element of x, plus 6 y
    24.0
    """
    names, _ = _wrt_list(program, wrt, "laplacian")
    setup = Setup(program, "laplacian")
    if setup.value_rank:
        raise DerivativeError(f"laplacian needs a scalar value, but '{setup.value}' has rank {setup.value_rank}")
    work = setup.work
    if weights is not None:
        _weights_input(program, setup, names, weights)
    terms = []
    for x in names:
        term = laplacian_sweep(work, x, setup.value, weights)
        if not is_zero(term):
            terms.append(term)
    name = work.tensor_fresh.pick([f"laplacian_{setup.value}"], "laplacian")
    total = ir.Num(0) if not terms else terms[0] if len(terms) == 1 else simplified(ir.Sum(tuple(terms)))
    forward = {s.target for s in work.statements[: setup.forward_count] if s.target is not None}
    work.statements.append(mark_missing_targets(ir.Assign(name, (), total)))
    # each forward value computed when the sweep first needs it, freed with its layer (einflow.derive.schedule)
    return on_demand(setup.assemble([name], False), forward)


def _gathers(program: Checked) -> bool:
    """Does the program read a tensor at positions taken from an integer tensor (``E[t[b],d]``)?"""
    return any(isinstance(node, ir.Read) and node.gathers for s in program.ir.statements if isinstance(s, ir.Assign)
               for node in ir.walk(s.expr))


@_deriving
def _laplacian_by_trace(program: Checked, wrt: str | Sequence[str]) -> Checked:
    """The Laplacian as the trace of the forward-over-reverse Hessian statement, read on its diagonal: the
    route for programs with gathered reads, whose scattered adjoints the forward sweep does not size."""
    setup, names, _, blocks = _second_derivatives(program, wrt, "laplacian")
    terms = []
    for x in names:
        statement = _diagonal(blocks[x, x], setup.work.ranks[x])
        if is_zero(statement.expr):
            continue  # an input the value is linear in adds nothing
        indices = statement.indices or ()
        present = indices_in(statement.expr)
        # a diagonal constant along an axis counts once per element: delta[p,p] (= 1) keeps the axis summed
        body = ir.product(statement.expr, *(ir.Delta(i, i) for i in indices if i not in present))
        terms.append(ir.Reduce(indices, body) if indices else body)
    name = setup.work.tensor_fresh.pick([f"laplacian_{setup.value}"], "laplacian")
    total = ir.Num(0) if not terms else terms[0] if len(terms) == 1 else ir.Sum(tuple(terms))
    setup.work.statements.append(ir.Assign(name, (), total))
    return setup.assemble([name], False)


def _new_input(program: Checked, name: str, what: str, role: str) -> None:
    """A DerivativeError unless ``name`` (the ``role=`` argument) can name a new input of ``program``."""
    try:
        check_name(name, "a tensor name")
    except EinflowError as error:
        raise DerivativeError(f"{what}: {role}= must be a tensor name: {error}") from None
    if name in program.info.inputs or name in program.info.targets:
        raise DerivativeError(f"{what}: {role} name '{name}' is already used by the program")


def _weights_input(program: Checked, setup: Setup, names: list[str], weights: str) -> None:
    """Register ``weights`` as a new input over the one wrt input's axes twice."""
    if len(names) != 1:
        raise DerivativeError("laplacian: weights= needs one wrt input (its axes twice are the weights' axes)")
    _new_input(program, weights, "laplacian", "weights")
    x = names[0]
    rank = setup.work.ranks[x]
    setup.tensor_names.take(weights)
    setup.work.ranks[weights] = 2 * rank
    for axis in range(2 * rank):
        setup.sizes.union(("axis", weights, axis), ("axis", x, axis % rank))


def _tangents(program: Checked, setup: Setup, names: list[str], tangent: str | Sequence[str] | None,
              as_tuple: bool, what: str) -> dict[str, Leaf]:
    """The tangent inputs (new tensors shaped like the ``wrt`` inputs) as seeds of a tangent sweep."""
    if tangent is None:
        chosen = ["T"] if not as_tuple else [f"T_{x}" for x in names]
    elif isinstance(tangent, str):
        if as_tuple:
            raise DerivativeError(f"{what}: wrt= is a list, so tangent= must list one name per input, got {tangent!r}")
        chosen = [tangent]
    elif isinstance(tangent, (list, tuple)) and len(tangent) == len(names):
        chosen = list(tangent)
    else:
        raise DerivativeError(f"{what}: tangent= must be a name (or one name per wrt input), got {tangent!r}")
    for name in chosen:
        try:
            check_name(name, "a tensor name")
        except EinflowError as error:
            raise DerivativeError(f"{what}: tangent= must be tensor names: {error}") from None
        if name in program.info.inputs or name in program.info.targets or chosen.count(name) > 1:
            raise DerivativeError(f"{what}: tangent name '{name}' is already used by the program")
    seeds: dict[str, Leaf] = {}
    for x, name in zip(names, chosen):
        setup.tensor_names.take(name)
        setup.work.ranks[name] = setup.work.ranks[x]
        for axis in range(setup.work.ranks[x]):
            setup.sizes.union(("axis", name, axis), ("axis", x, axis))

        def seed(node: ir.Tensor, name: str = name, symmetric: bool = x in setup.work.symmetric,
                 hermitian: bool = x in hermitian_inputs()) -> ir.Expr:
            if symmetric and len(node.indices) == 2:  # a declared matrix moves along the tangent's symmetric part
                swapped: ir.Expr = ir.Tensor(name, node.indices[::-1])  # (T + T^H)/2 for a Hermitian one
                swapped = ir.Call("conj", swapped) if hermitian else swapped
                return ir.Sum((ir.product(ir.Num(0.5), ir.Tensor(name, node.indices)),
                               ir.product(ir.Num(0.5), swapped)))
            return ir.Tensor(name, node.indices)

        seeds[x] = seed
    return seeds


@_deriving
def jvp(program: Checked, wrt: str | Sequence[str], tangent: str | Sequence[str] | None = None) -> Checked:
    """The value's directional derivative along a tangent: ``sum over X of dvalue/dX . T`` (value's shape).

    ``tangent`` names the new input(s) shaped like ``wrt`` (default ``T``, or ``T_X`` for each of a list).
    Forward mode: tangents are carried through the statements; nothing larger than the program's own
    values is built.

    >>> import numpy as np, einflow as ef
    >>> j = ef.jvp("y[i] = A[i,j] x[j]", wrt="x", tangent="t")
    >>> print(j)
    jvp_y[i] = A[i,j] t[j]
    >>> j(A=np.eye(2), t=np.array([1.0, 2.0])).tolist()
    [1.0, 2.0]
    """
    names, as_tuple = _wrt_list(program, wrt, "jvp")
    setup = Setup(program, "jvp")
    work = setup.work
    seeds = _tangents(program, setup, names, tangent, as_tuple, "jvp")
    through = [s.target for s in work.statements if s.target]
    results = tangent_sweep(work, seeds, (), lambda t: f"jvp_{t}", through, [setup.value])
    value = work.target(setup.value)
    assert value is not None
    statement = results.get(setup.value) or _zero_derivative(value, ())
    name = work.tensor_fresh.pick([f"jvp_{setup.value}"], "jvp")
    work.statements.append(ir.Assign(name, statement.indices, statement.expr))
    return setup.assemble([name], False)


@_deriving
def hvp(program: Checked, wrt: str | Sequence[str], tangent: str | Sequence[str] | None = None) -> Checked:
    """The Hessian of a scalar program times a tangent, ``sum over q of H[p,q] V[q]``, without forming H.

    Forward over reverse: the gradient's statements are differentiated along the tangent, so the largest
    intermediate is of the size of the program's own values (a list of ``wrt`` gives one block row each).

    >>> import numpy as np, einflow as ef
    >>> h = ef.hvp("f = x[i] A[i,j] x[j]", wrt="x", tangent="v")
    >>> print(h)
    size p = x
    hvp_x[p] = A[p,j] v[j] + A[i,p] v[i]
    >>> h(A=np.array([[1.0, 2.0], [0.0, 1.0]]), x=np.zeros(2), v=np.array([1.0, 0.0])).tolist()
    [2.0, 2.0]
    """
    program, setup, names, as_tuple, gradients = _reverse(program, wrt, "hvp")
    work = setup.work
    seeds = _tangents(program, setup, names, tangent, as_tuple, "hvp")
    through = [s.target for s in work.statements if s.target]
    results = tangent_sweep(work, seeds, (), lambda t: f"hvp_{t}", through, [gradients[x] for x in names])
    outputs = []
    for x in names:
        gradient = work.target(gradients[x])
        assert gradient is not None
        statement = results.get(gradients[x]) or _zero_derivative(gradient, ())
        name = work.tensor_fresh.pick([f"hvp_{x}"], f"hvp_{x}_")
        work.statements.append(ir.Assign(name, statement.indices, statement.expr))
        outputs.append(name)
    return setup.assemble(outputs, as_tuple)


# ---------------------------------------------------------------- batch indices and operators (LANGUAGE.md §9.1)
Batched = str | Sequence[str] | None


def _structured(derivation: Callable[..., Checked], program: Checked, wrt: str | Sequence[str], batch: Batched,
                what: str, **options: Any) -> Checked:
    """``derivation`` per sample along the ``batch`` indices (einflow.derive.batch), else along the indices a
    program whose value is a sum over samples sums (``L = sum[b](...)``: the derivative is block diagonal in
    them), else of the whole program."""
    if batch is not None:
        names = batch_names(batch, what)
        wrt_names, _ = _wrt_list(program, wrt, what)
        found = follow(program, names, wrt_names, what)
        return restore(derivation(strip(program, found), wrt, **options), found)
    wrt_names, as_list = _wrt_list(program, wrt, what)
    if what == "jacobian" and not as_list:
        samples = sample_indices(program, wrt_names)
        if samples is not None:
            per = restore(derivation(strip(program, samples), wrt, **options), samples)
            ranks = program.info.ranks
            outputs = value_indices(program)  # (a bare last expression: its free indices in order)
            value = {n: outputs.index(n) for n in samples.names}
            return expanded(per, samples.names, [(len(value_indices(program)), value),
                                                  (ranks[wrt_names[0]], samples.of(wrt_names[0]))])
        return derivation(program, wrt, **options)
    summed = summed_batch(program, wrt_names) if what != "jacobian" and (what == "laplacian" or not as_list) else None
    if summed is None:
        return derivation(program, wrt, **options)
    source, samples = summed
    per = restore(derivation(strip(source, samples), wrt, **options), samples)
    if what == "laplacian":
        return expanded(per, samples.names, [])
    x = wrt_names[0]
    group = (program.info.ranks[x], samples.of(x))
    return expanded(per, samples.names, [group] if what == "hessian_diagonal" else [group, group])


def jacobian(program: Checked, wrt: str | Sequence[str], mode: str = "auto", batch: Batched = None) -> Checked:
    return _structured(_jacobian, program, wrt, batch, "jacobian", mode=mode)


@_deriving
def wirtinger_hessian(program: Checked, wrt: str) -> Checked:
    """The Wirtinger Hessian of a real scalar program by a complex input z, as the pair ``(A, B)`` with
    ``A[k,l] = d2L/dconj(z_k)dz_l`` and ``B[k,l] = d2L/dconj(z_k)dconj(z_l)`` (LANGUAGE.md 9.2), so that
    ``hvp(v) = 2 (A v + B conj(v))``.

    The gradient g = 2 dL/dconj(z) is differentiated forward along the real and the imaginary unit
    directions, H_re = 2 (A + B) and H_im = 2i (A - B), so A = (H_re - i H_im)/4, B = (H_re + i H_im)/4.

    >>> import numpy as np, einflow as ef
    >>> A, B = ef.hessian("f = real(sum[i](conj(z[i]) M[i,j] z[j]))", wrt="z", wirtinger=True)(
    ...     z=np.array([1j, 2.0]), M=np.array([[2.0, 1j], [-1j, 3.0]]))
    >>> A.round(12).tolist(), B.round(12).tolist()
    ([[(2+0j), 1j], [-1j, (3+0j)]], [[0j, 0j], [0j, 0j]])
    """
    if not isinstance(wrt, str):
        raise DerivativeError("hessian(..., wirtinger=True) takes one wrt name (a complex input)")
    _, setup, names, _, gradients = _reverse(program, wrt, "hessian")
    work = setup.work
    through = [s.target for s in work.statements if s.target]
    gradient = work.target(gradients[wrt])
    assert gradient is not None
    outputs = []
    parts: list[ir.Tensor] = []
    for unit, label in ((ir.Num(1), "re"), (ir.Num(1j), "im")):  # type: ignore[arg-type]
        axes = work.fresh_indices(wrt)
        real_leaf = input_leaf(wrt, axes, wrt in work.symmetric)

        def leaf(node: ir.Tensor, real_leaf: Leaf = real_leaf, unit: ir.Num = unit) -> ir.Expr | None:
            varied = real_leaf(node)
            return None if varied is None else ir.product(unit, varied)

        results = tangent_sweep(work, {wrt: leaf}, axes, lambda t, label=label: f"d{t}_{label}", through,
                                [gradients[wrt]])
        statement = results.get(gradients[wrt]) or _zero_derivative(gradient, axes)
        name = work.tensor_fresh.pick([f"H_{label}"], f"H_{label}")
        indices = statement.indices or ()
        work.statements.append(ir.Assign(name, indices, statement.expr))
        if parts:  # the imaginary direction's axes read as the real one's
            indices = tuple(parts[0].indices)
        parts.append(ir.Tensor(name, indices))
    real_direction, imaginary_direction = parts
    for name, sign in ((f"d2{setup.value}_dconj{wrt}d{wrt}", -1), (f"d2{setup.value}_dconj{wrt}2", 1)):
        target = work.tensor_fresh.pick([name], name)
        expr = ir.Sum((ir.product(ir.Num(0.25), real_direction),
                       ir.product(ir.Num(complex(0, 0.25 * sign)), imaginary_direction)))  # type: ignore[arg-type]
        work.statements.append(ir.Assign(target, real_direction.indices, expr))
        outputs.append(target)
    return setup.assemble(outputs, True)


def hessian(program: Checked, wrt: str | Sequence[str], batch: Batched = None) -> Checked:
    return _structured(_hessian, program, wrt, batch, "hessian")


def hessian_diagonal(program: Checked, wrt: str | Sequence[str], batch: Batched = None) -> Checked:
    return _structured(_hessian_diagonal, program, wrt, batch, "hessian_diagonal")


def laplacian(program: Checked, wrt: str | Sequence[str], batch: Batched = None, weights: str | None = None) -> Checked:
    if weights is None and _gathers(program):
        return _structured(_laplacian_by_trace, program, wrt, batch, "laplacian")
    return _structured(_laplacian, program, wrt, batch, "laplacian", weights=weights)


def _bilaplacian(program: Checked, wrt: str | Sequence[str]) -> Checked:
    """One collapsed fourth-order sweep (einflow.derive.taylor_collapsed) for one wrt input; the Laplacian of
    the Laplacian where several inputs' directions mix or the program gathers."""
    names, _ = _wrt_list(program, wrt, "bilaplacian")
    if len(names) == 1 and not _gathers(program):
        return _bilaplacian_collapsed(program, names[0])
    return _bilaplacian_nested(program, wrt)


@_deriving
def _bilaplacian_collapsed(program: Checked, wrt: str) -> Checked:
    setup = Setup(program, "bilaplacian")
    if setup.value_rank:
        raise DerivativeError(f"bilaplacian needs a scalar value, but '{setup.value}' has rank {setup.value_rank}")
    work = setup.work
    name = work.tensor_fresh.pick([f"bilaplacian_{setup.value}"], "bilaplacian")
    work.statements.append(mark_missing_targets(ir.Assign(name, (), bilaplacian_sweep(work, wrt, setup.value))))
    return setup.assemble([name], False)


def _bilaplacian_nested(program: Checked, wrt: str | Sequence[str]) -> Checked:
    once = _laplacian(program, wrt)
    value = value_name(program) or "f"
    read = [x for x in ([wrt] if isinstance(wrt, str) else wrt) if x in once.info.inputs]
    if not read:  # the Laplacian does not depend on wrt: its Laplacian is zero
        return with_name(checked(ir.ProgramIR((ir.Assign("f", (), ir.Num(0)),))), f"bilaplacian_{value}")
    return with_name(_laplacian(once, read if len(read) > 1 else read[0]), f"bilaplacian_{value}")


def bilaplacian(program: Checked, wrt: str | Sequence[str], batch: Batched = None) -> Checked:
    """The Laplacian of the Laplacian of a scalar program (per sample with ``batch=``).

    >>> import numpy as np, einflow as ef
    >>> b = ef.bilaplacian("f = (x[i] x[i])^2", wrt="x")  # |x|^4: its bi-Laplacian is 8 n (n + 2)
    >>> float(b(x=np.ones(3)))
    120.0
    """
    return _structured(_bilaplacian, program, wrt, batch, "laplacian")


_BATCH_DOC = "\n    ``batch=`` names output indices that index independent samples (LANGUAGE.md §9.1): "
for _public, _private, _extra in [
    (jacobian, _jacobian, "the result is\n    ``J[b, <other output indices>, <wrt's other axes>]``, each batch index "
                          "once.\n"),
    (hessian, _hessian, "the result is\n    the per-sample Hessian ``H[b, k, l]``, each batch index once.\n"),
    (hessian_diagonal, _hessian_diagonal, "the per-sample diagonal\n    ``[b, k]``.\n"),
    (laplacian, _laplacian, "the per-sample Laplacian\n    ``[b]``. ``weights=\"C\"`` names a new input over "
                            "wrt's axes twice: ``sum[k,l](C[k,l] d2f/dx[k]dx[l])``.\n"),
]:
    _public.__doc__ = (_private.__doc__ or "").rstrip() + "\n" + _BATCH_DOC + _extra


@_deriving
def taylor(program: Checked, wrt: str, direction: str = "v", order: int = 2) -> Checked:
    """The derivatives ``d^k/dt^k f(x + t v)`` at ``t = 0`` for ``k = 1..order``, as one program returning them
    in order (each shaped like the value); ``direction`` names the new input ``v``, shaped like ``wrt``. One
    forward sweep carries every statement's Taylor coefficients (einflow.derive.taylor): no nested passes.

    >>> import numpy as np, einflow as ef
    >>> t = ef.taylor("f = exp(2 x[i] x[i])", wrt="x", direction="v", order=3)
    >>> [round(float(d), 6) for d in t(x=np.zeros(2), v=np.array([1.0, 0.0]))]  # exp(2 t^2) at 0: 0, 4, 0
    [0.0, 4.0, 0.0]
    """
    if not isinstance(wrt, str):
        raise DerivativeError(f"taylor: wrt= must name one input, got {wrt!r}")
    _wrt_list(program, wrt, "taylor")
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise DerivativeError(f"taylor: order= must be a positive integer, got {order!r}")
    setup = Setup(program, "taylor")
    _tangents(program, setup, [wrt], direction, False, "taylor")
    work = setup.work
    found = taylor_sweep(work, wrt, direction, order, setup.value)
    value = work.target(setup.value)
    assert value is not None
    indices = value.indices or ()
    outputs = []
    for k, expr in enumerate(found, start=1):
        name = work.tensor_fresh.pick([f"d{k}{setup.value}_dt{k}"], f"taylor{k}")
        body = zeros(indices) if is_zero(expr) else expr
        work.statements.append(mark_missing_targets(ir.Assign(name, indices, body)))
        outputs.append(name)
    return setup.assemble(outputs, True)

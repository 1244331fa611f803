"""The derivative functions of the public API: einflow text or a Program in, a new Program out.

``einflow.derive`` does the work on checked program data (IR -> IR); here the result becomes a
``Program`` that accepts every array the source program's caller holds. The examples are in each
function's docstring (shared with ``einflow.derive``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from einflow import derive
from einflow.derive.conjugate import holomorphic_obstacle
from einflow.lang import ir
from einflow.lang.check import Checked
from einflow.lang.errors import DerivativeError
from einflow.program import Program, compile

__all__ = ["grad", "jacobian", "hessian", "hessian_diagonal", "laplacian", "bilaplacian", "taylor", "vjp", "jvp", "hvp",
           "value_and_grad"]

Wrt = str | Sequence[str]
Batch = str | Sequence[str] | None


def _program(derived: Checked, source: Program, seeds: Sequence[str] = (),
             by: Sequence[str | None] | None = None) -> Program:
    """``derived`` as a Program; the caller holds the source program's arrays, so it may pass them all, and
    the tangents or cotangent it named (``seeds``), even where a zero derivative reads none of them. ``by``:
    the input each output is a derivative by (None for a value), whose float dtype it is given."""
    program = Program(derived.ir, derived.source, derived.info)
    program.accepts = frozenset(source.inputs) | frozenset(source.info.targets) | source.accepts | frozenset(seeds)
    if by is not None and len(by) == len(program.info.outputs):
        program.casts = tuple(by)  # each output in the float dtype of the input it is by (Program._cast)
    if any(isinstance(node, ir.Linalg) and node.kind == "logdet" for s in source.ir.statements
           if isinstance(s, ir.Assign) for node in ir.walk(s.expr)):
        # log|det| of a complex matrix is not holomorphic; its rules are the real ones
        return HolomorphicOnly(program, "derivatives through logdet of complex matrices are not supported yet (the "
                                        "value is: log|det|, real); pass real matrices")
    declared = [name for s in source.ir.statements if isinstance(s, ir.MatrixDecl) and s.kind in ("spd", "hermitian")
                for name in s.names if name in source.inputs]
    if declared:  # the projection on Hermitian matrices, (G + G^H)/2, is the symmetric one's for real matrices only
        return HolomorphicOnly(program, f"derivatives by the declared matrix {declared[0]!r} are not supported yet "
                                        "for complex matrices (its value is); pass real matrices")
    return program


class HolomorphicOnly(Program):
    """A Jacobian or Hessian of a program that is not holomorphic (LANGUAGE.md 9.2): called with complex arrays,
    a DerivativeError naming the function (there is no complex derivative f'(z)); real arrays run as usual."""

    __slots__ = ("refusal",)

    def __init__(self, program: Program, refusal: str) -> None:
        super().__init__(program.ir, program.source, program.info)
        self.accepts = program.accepts
        self.casts = program.casts
        #: the message a call with complex arrays raises
        self.refusal = refusal

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        _refuse_complex(self.refusal, args, kwargs)
        return super().__call__(*args, **kwargs)


def _refuse_complex(refusal: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A DerivativeError saying ``refusal`` when any array passed is complex."""
    if refusal is None:
        return
    arrays = [*args, *kwargs.values()]
    if len(args) == 1 and isinstance(args[0], Mapping):
        arrays.extend(args[0].values())
    if any(_complex(array) for array in arrays):
        raise DerivativeError(refusal)


def _complex(array: Any) -> bool:
    if isinstance(array, complex):
        return True
    dtype = getattr(array, "dtype", None)
    return bool(getattr(dtype, "is_complex", False)) or getattr(dtype, "kind", None) == "c"


def _refusing(derived: Program, source: Program, what: str, hint: str) -> Program:
    """``derived`` refusing complex arrays when ``source`` is not holomorphic (its text has conj, abs, ...)."""
    obstacle = holomorphic_obstacle([s.expr for s in source.ir.statements if isinstance(s, ir.Assign)])
    if obstacle is None:
        return derived
    return HolomorphicOnly(derived, f"{what}: the program is not holomorphic (it applies '{obstacle}'), so a complex "
                                    f"input has no complex derivative f'(z); {hint} (docs/derivatives.md, "
                                    "complex numbers)")


def _by(wrt: Wrt) -> list[str | None]:
    return [wrt] if isinstance(wrt, str) else list(wrt)


def _tangent_names(wrt: Wrt, tangent: str | Sequence[str] | None) -> list[str]:
    """The tangent inputs a jvp or hvp names (``einflow.derive``'s defaults: ``T``, or ``T_X`` for each of a list)."""
    if tangent is None:
        return ["T"] if isinstance(wrt, str) else [f"T_{x}" for x in wrt]
    return [tangent] if isinstance(tangent, str) else list(tangent)


def _documented(rule: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def attach(face: Callable[..., Any]) -> Callable[..., Any]:
        face.__doc__ = rule.__doc__
        return face

    return attach


@_documented(derive.grad)
def grad(p: str | Program, wrt: Wrt) -> Program:
    program = compile(p)
    return _program(derive.grad(program.checked, wrt), program, by=_by(wrt))


@_documented(derive.jacobian)
def jacobian(p: str | Program, wrt: Wrt, mode: str = "auto", batch: Batch = None) -> Program:
    program = compile(p)
    return _refusing(_program(derive.jacobian(program.checked, wrt, mode, batch=batch), program, by=_by(wrt)),
                     program, "jacobian", "use jvp(...) or vjp(...), or grad(...) of a real value")


@_documented(derive.hessian)
def hessian(p: str | Program, wrt: Wrt, batch: Batch = None, wirtinger: bool = False) -> Program:
    program = compile(p)
    if wirtinger:
        if batch is not None:
            raise DerivativeError("hessian(..., wirtinger=True) takes no batch=")
        return _program(derive.wirtinger_hessian(program.checked, wrt), program)  # type: ignore[arg-type]
    return _refusing(_program(derive.hessian(program.checked, wrt, batch=batch), program,
                              by=_by(wrt) if isinstance(wrt, str) else None), program, "hessian",
                     "use hessian(..., wirtinger=True) for the pair (A, B), or hvp")


@_documented(derive.hessian_diagonal)
def hessian_diagonal(p: str | Program, wrt: Wrt, batch: Batch = None) -> Program:
    program = compile(p)
    return _program(derive.hessian_diagonal(program.checked, wrt, batch=batch), program)


@_documented(derive.laplacian)
def laplacian(p: str | Program, wrt: Wrt, batch: Batch = None, weights: str | None = None) -> Program:
    program = compile(p)
    return _program(derive.laplacian(program.checked, wrt, batch=batch, weights=weights), program,
                    [weights] if weights is not None else [])


@_documented(derive.bilaplacian)
def bilaplacian(p: str | Program, wrt: Wrt, batch: Batch = None) -> Program:
    program = compile(p)
    return _program(derive.bilaplacian(program.checked, wrt, batch=batch), program)


@_documented(derive.taylor)
def taylor(p: str | Program, wrt: str, direction: str = "v", order: int = 2) -> Program:
    program = compile(p)
    return _program(derive.taylor(program.checked, wrt, direction, order), program, [direction],
                    by=[wrt] * order if isinstance(order, int) and order > 0 else None)


@_documented(derive.vjp)
def vjp(p: str | Program, wrt: Wrt, cotangent: str = "G") -> Program:
    program = compile(p)
    return _program(derive.vjp(program.checked, wrt, cotangent), program, [cotangent], by=_by(wrt))


@_documented(derive.jvp)
def jvp(p: str | Program, wrt: Wrt, tangent: str | Sequence[str] | None = None) -> Program:
    program = compile(p)
    return _program(derive.jvp(program.checked, wrt, tangent), program, _tangent_names(wrt, tangent))


@_documented(derive.hvp)
def hvp(p: str | Program, wrt: Wrt, tangent: str | Sequence[str] | None = None) -> Program:
    program = compile(p)
    derived = _program(derive.hvp(program.checked, wrt, tangent), program, _tangent_names(wrt, tangent), by=_by(wrt))
    kinked = {node.func for s in program.ir.statements if isinstance(s, ir.Assign) for node in ir.walk(s.expr)
              if isinstance(node, ir.Call) and node.func in ("abs", "sign")}
    if kinked:  # sign(z) = z/|z| varies on complex numbers; the rules treat it as locally constant (real numbers)
        return HolomorphicOnly(derived, f"hvp: second derivatives through '{sorted(kinked)[0]}' of complex numbers are "
                                        "not supported; write |z| as sqrt(abs2(z)) (docs/derivatives.md)")
    return derived


@_documented(derive.value_and_grad)
def value_and_grad(p: str | Program, wrt: Wrt) -> Program:
    program = compile(p)
    derived = _program(derive.value_and_grad(program.checked, wrt), program, by=[None, *_by(wrt)])
    return ValueAndGrad(derived, as_tuple=not isinstance(wrt, str))


class ValueAndGrad(Program):
    """A program whose call returns ``(value, gradient)``, or ``(value, (gradients...))`` for a list of ``wrt``."""

    __slots__ = ("gradients_as_tuple", "refusal")

    def __init__(self, program: Program, as_tuple: bool) -> None:
        super().__init__(program.ir, program.source, program.info)
        self.accepts = program.accepts
        self.casts = program.casts
        #: whether the gradients come as a tuple (``wrt`` was a list) or as one array
        self.gradients_as_tuple = as_tuple
        #: a complex array's DerivativeError (``HolomorphicOnly``), or None
        self.refusal: str | None = getattr(program, "refusal", None)

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        _refuse_complex(self.refusal, args, kwargs)
        value, *gradients = super().__call__(*args, **kwargs)
        return value, (tuple(gradients) if self.gradients_as_tuple else gradients[0])

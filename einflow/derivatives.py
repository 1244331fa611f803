"""The derivative functions of the public API: einflow text or a Program in, a new Program out.

``einflow.derive`` does the work on checked program data (IR -> IR); here the result becomes a
``Program`` that accepts every array the source program's caller holds. The examples are in each
function's docstring (shared with ``einflow.derive``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from einflow import derive
from einflow.derive.conjugate import complex_arrays, holomorphic_obstacle
from einflow.lang import ir
from einflow.lang.check import Checked
from einflow.lang.errors import DerivativeError
from einflow.program import Program, compile

__all__ = ["grad", "jacobian", "hessian", "hessian_diagonal", "laplacian", "bilaplacian", "taylor", "vjp", "jvp", "hvp",
           "value_and_grad"]

Wrt = str | Sequence[str]
Batch = str | Sequence[str] | None


def _plain(derived: Checked, source: Program, seeds: Sequence[str] = (),
           by: Sequence[str | None] | None = None) -> Program:
    """``derived`` as a Program; the caller holds the source program's arrays, so it may pass them all, and
    the tangents or cotangent it named (``seeds``), even where a zero derivative reads none of them. ``by``:
    the input each output is a derivative by (None for a value), whose float dtype it is given."""
    program = Program(derived.ir, derived.source, derived.info)
    program.accepts = frozenset(source.inputs) | frozenset(source.info.targets) | source.accepts | frozenset(seeds)
    if by is not None and len(by) == len(program.info.outputs):
        program.casts = tuple(by)  # each output in the float dtype of the input it is by (Program._cast)
    return program


def _hermitian(source: Program) -> list[str]:
    """The inputs declared spd or hermitian: on complex arrays they vary on the Hermitian matrices."""
    return [name for s in source.ir.statements if isinstance(s, ir.MatrixDecl) and s.kind in ("spd", "hermitian")
            for name in s.names if name in source.inputs]


def _has_logdet(source: Program) -> bool:
    return any(isinstance(node, ir.Linalg) and node.kind == "logdet" for s in source.ir.statements
               if isinstance(s, ir.Assign) for node in ir.walk(s.expr))


def _kinked(source: Program) -> bool:
    """Does ``source`` apply abs or sign (on complex numbers sign(u) = u/|u| varies: second derivatives differ)?"""
    return any(isinstance(node, ir.Call) and node.func in ("abs", "sign") for s in source.ir.statements
               if isinstance(s, ir.Assign) for node in ir.walk(s.expr))


def _program(derived: Checked, source: Program, seeds: Sequence[str] = (),
             by: Sequence[str | None] | None = None, for_complex: Callable[[], Checked] | None = None,
             second_order: bool = False, wrt: Wrt = ()) -> Program:
    """``derived`` as a Program (``_plain``). Where complex arrays need a derivation of their own (logdet, an
    input declared spd or hermitian among ``wrt``; abs and sign for ``second_order`` derivatives),
    ``for_complex`` derives it (under ``complex_arrays``) at the first call with complex arrays; without it,
    such a call is refused (a Jacobian: log|det| and the Hermitian matrices have no complex derivative)."""
    program = _plain(derived, source, seeds, by)
    names = _by(wrt) if wrt else []
    hermitian = [name for name in _hermitian(source) if name in names]
    logdet = _has_logdet(source)
    if not (logdet or hermitian or second_order and _kinked(source)):
        return program
    if for_complex is not None:
        def complex_program() -> Program:
            with complex_arrays(hermitian):
                return _plain(for_complex(), source, seeds, by)

        return ForComplex(program, complex_program)
    if logdet:
        return ForComplex(program, None, "logdet of a complex matrix is log|det|, which is not holomorphic: it has "
                                         "no complex derivative f'(z); use grad, vjp, jvp or hvp")
    return ForComplex(program, None, f"the declared matrix {hermitian[0]!r} varies on the Hermitian matrices, where "
                                     "a complex derivative f'(z) does not exist; use grad, vjp, jvp or hvp")


class ForComplex(Program):
    """A derivative program whose calls with complex arrays run another derivation (LANGUAGE.md 9.2): the rules of
    logdet, of a declared Hermitian matrix and of sign differ on complex numbers, and a derivation does not know
    the arrays. The program as printed and exported is the one for real arrays; ``complex_program`` is the
    other (derived at its first use). Without one, a call with complex arrays is a DerivativeError."""

    __slots__ = ("refusal", "_complex_form", "_complex_program")

    def __init__(self, program: Program, complex_form: Callable[[], Program] | None,
                 refusal: str | None = None) -> None:
        super().__init__(program.ir, program.source, program.info)
        self.accepts = program.accepts
        self.casts = program.casts
        #: the message a call with complex arrays raises, or None
        self.refusal = refusal
        self._complex_form = complex_form
        self._complex_program: Program | None = getattr(program, "_complex_program", None)

    @property
    def complex_program(self) -> Program:
        """The derivative program for complex arrays (print or export it to see its conj and real calls)."""
        if self._complex_program is None:
            if self._complex_form is None:
                raise DerivativeError(self.refusal or "no derivation for complex arrays")
            self._complex_program = self._complex_form()
        return self._complex_program

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._complex_form is None and self._complex_program is None and self.refusal is None \
                or not _any_complex(args, kwargs):
            return Program.__call__(self, *args, **kwargs)
        return self.complex_program(*args, **kwargs)

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._run(args, kwargs)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its complex program derived (the derivation is a closure)."""
        if self._complex_form is not None:
            self.complex_program  # noqa: B018 - derived now, kept in the state
        state = super().__getstate__()
        state["_complex_form"] = None
        return state


class HolomorphicOnly(ForComplex):
    """A Jacobian or Hessian of a program that is not holomorphic (LANGUAGE.md 9.2): called with complex arrays,
    a DerivativeError naming the function (there is no complex derivative f'(z)); real arrays run as usual."""

    __slots__ = ()

    def __init__(self, program: Program, refusal: str) -> None:
        super().__init__(program, None, refusal)


def _any_complex(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    arrays = [*args, *kwargs.values()]
    if len(args) == 1 and isinstance(args[0], Mapping):
        arrays.extend(args[0].values())
    return any(_complex(array) for array in arrays)


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
    return _program(derive.grad(program.checked, wrt), program, by=_by(wrt), wrt=wrt,
                    for_complex=lambda: derive.grad(program.checked, wrt))


@_documented(derive.jacobian)
def jacobian(p: str | Program, wrt: Wrt, mode: str = "auto", batch: Batch = None) -> Program:
    program = compile(p)
    return _refusing(_program(derive.jacobian(program.checked, wrt, mode, batch=batch), program, by=_by(wrt), wrt=wrt),
                     program, "jacobian", "use jvp(...) or vjp(...), or grad(...) of a real value")


@_documented(derive.hessian)
def hessian(p: str | Program, wrt: Wrt, batch: Batch = None, wirtinger: bool = False) -> Program:
    program = compile(p)
    if wirtinger:
        if batch is not None:
            raise DerivativeError("hessian(..., wirtinger=True) takes no batch=")
        if isinstance(wrt, str) and wrt in _hermitian(program):
            raise DerivativeError(f"hessian(..., wirtinger=True) by the declared matrix {wrt!r} is not supported "
                                  "(it varies on the Hermitian matrices); use hvp")
        return _program(derive.wirtinger_hessian(program.checked, wrt), program,  # type: ignore[arg-type]
                        for_complex=lambda: derive.wirtinger_hessian(program.checked, wrt),  # type: ignore[arg-type]
                        second_order=True, wrt=wrt)
    return _refusing(_program(derive.hessian(program.checked, wrt, batch=batch), program,
                              by=_by(wrt) if isinstance(wrt, str) else None, wrt=wrt), program, "hessian",
                     "use hessian(..., wirtinger=True) for the pair (A, B), or hvp")


# the diagonal and the trace of the complex Hessian f''(z), which a program that is not holomorphic lacks
_SECOND_ORDER_HINT = "use hvp, or hessian(..., wirtinger=True) for the pair (A, B)"


@_documented(derive.hessian_diagonal)
def hessian_diagonal(p: str | Program, wrt: Wrt, batch: Batch = None) -> Program:
    program = compile(p)
    return _refusing(_program(derive.hessian_diagonal(program.checked, wrt, batch=batch), program, wrt=wrt),
                     program, "hessian_diagonal", _SECOND_ORDER_HINT)


@_documented(derive.laplacian)
def laplacian(p: str | Program, wrt: Wrt, batch: Batch = None, weights: str | None = None) -> Program:
    program = compile(p)
    return _refusing(_program(derive.laplacian(program.checked, wrt, batch=batch, weights=weights), program,
                              [weights] if weights is not None else [], wrt=wrt), program, "laplacian",
                     _SECOND_ORDER_HINT)


@_documented(derive.bilaplacian)
def bilaplacian(p: str | Program, wrt: Wrt, batch: Batch = None) -> Program:
    program = compile(p)
    return _refusing(_program(derive.bilaplacian(program.checked, wrt, batch=batch), program, wrt=wrt), program,
                     "bilaplacian", _SECOND_ORDER_HINT)


@_documented(derive.taylor)
def taylor(p: str | Program, wrt: str, direction: str = "v", order: int = 2) -> Program:
    program = compile(p)
    return _program(derive.taylor(program.checked, wrt, direction, order), program, [direction],
                    by=[wrt] * order if isinstance(order, int) and order > 0 else None, wrt=wrt)


@_documented(derive.vjp)
def vjp(p: str | Program, wrt: Wrt, cotangent: str = "G") -> Program:
    program = compile(p)
    return _program(derive.vjp(program.checked, wrt, cotangent), program, [cotangent], by=_by(wrt), wrt=wrt,
                    for_complex=lambda: derive.vjp(program.checked, wrt, cotangent))


@_documented(derive.jvp)
def jvp(p: str | Program, wrt: Wrt, tangent: str | Sequence[str] | None = None) -> Program:
    program = compile(p)
    return _program(derive.jvp(program.checked, wrt, tangent), program, _tangent_names(wrt, tangent), wrt=wrt,
                    for_complex=lambda: derive.jvp(program.checked, wrt, tangent))


@_documented(derive.hvp)
def hvp(p: str | Program, wrt: Wrt, tangent: str | Sequence[str] | None = None) -> Program:
    program = compile(p)
    return _program(derive.hvp(program.checked, wrt, tangent), program, _tangent_names(wrt, tangent), by=_by(wrt),
                    wrt=wrt, for_complex=lambda: derive.hvp(program.checked, wrt, tangent), second_order=True)


@_documented(derive.value_and_grad)
def value_and_grad(p: str | Program, wrt: Wrt) -> Program:
    program = compile(p)
    derived = _program(derive.value_and_grad(program.checked, wrt), program, by=[None, *_by(wrt)], wrt=wrt,
                       for_complex=lambda: derive.value_and_grad(program.checked, wrt))
    return ValueAndGrad(derived, as_tuple=not isinstance(wrt, str))


class ValueAndGrad(ForComplex):
    """A program whose call returns ``(value, gradient)``, or ``(value, (gradients...))`` for a list of ``wrt``."""

    __slots__ = ("gradients_as_tuple",)

    def __init__(self, program: Program, as_tuple: bool) -> None:
        super().__init__(program, getattr(program, "_complex_form", None), getattr(program, "refusal", None))
        #: whether the gradients come as a tuple (``wrt`` was a list) or as one array
        self.gradients_as_tuple = as_tuple

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        value, *gradients = self._run(args, kwargs)
        return value, (tuple(gradients) if self.gradients_as_tuple else gradients[0])

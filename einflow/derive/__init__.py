"""Symbolic derivatives, IR -> IR: a checked program in, a checked derivative program out.

Gradients, Jacobians, Hessians, VJPs, JVPs and HVPs are new programs (``einflow.derivatives`` wraps them
into ``Program`` objects for the public API).

>>> from einflow.lang.check import checked
>>> from einflow.lang.grammar import parse
>>> from einflow.lang.ir import format_program
>>> print(format_program(hessian(checked(parse("f = x[i] A[i,j] x[j]")), wrt="x").ir))
size p = x
size q = x
d2f_dx2[p,q] = A[p,q] + A[q,p]
"""

from einflow.derive.api import (
    bilaplacian,
    grad,
    hessian,
    hessian_diagonal,
    hvp,
    jacobian,
    jvp,
    laplacian,
    taylor,
    value_and_grad,
    vjp,
    wirtinger_hessian,
)

__all__ = ["grad", "jacobian", "hessian", "wirtinger_hessian",
           "hessian_diagonal", "laplacian", "bilaplacian", "taylor", "vjp", "jvp",
           "hvp", "value_and_grad"]

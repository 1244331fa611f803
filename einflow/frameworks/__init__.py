"""einflow inside PyTorch and JAX: programs called on tensors return tensors, differentiable by the framework.

``Program.__call__`` hands torch tensors and jax arrays here (backend ``torch`` / ``jax``, chosen by
``auto``). The program runs as generated torch / jax.numpy code, planned once per signature (shapes,
dtypes and, for torch, device). Its derivative is einflow's own: a torch tensor that requires grad
gets one autograd node whose backward runs ``einflow.vjp(program)`` (:mod:`.torch_autograd`); under
jax the call is a ``jax.custom_jvp`` whose tangent is ``einflow.jvp(program)`` (:mod:`.jax_jvp`; jax
transposes it for reverse mode). The derivative program is called through the same mechanism, so
second derivatives work too. The torch node also works inside ``torch.func`` (``grad``, ``jacrev``,
``jacfwd``, ``hessian``, ``vmap``): forward mode runs ``einflow.jvp(program)`` and ``vmap`` runs the
program batched by a leading index (:func:`batched_program`).

>>> import torch, einflow as ef
>>> loss = ef.compile("L = sum[n]((X[n,i] w[i] - y[n])^2)")
>>> w = torch.zeros(2, dtype=torch.float64, requires_grad=True)
>>> X, y = torch.eye(2, dtype=torch.float64), torch.tensor([1.0, 2.0], dtype=torch.float64)
>>> loss(X=X, w=w, y=y).backward()
>>> w.grad.tolist()
[-2.0, -4.0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from einflow.engine.backends import get_backend
from einflow.frameworks.programs import batched_program, jvp_program, plan_for, value_and_grad_program, vjp_program
from einflow.lang.errors import EinflowError
from einflow.program import FRAMEWORK_CALLS, compile

__all__ = ["call", "function", "vjp_program", "jvp_program", "value_and_grad_program", "batched_program", "plan_for"]


def call(program: Any, values: list[Any], name: str, optimize: Any, memory_limit: Any) -> Any:
    """Run ``program`` on the ``torch`` or ``jax`` backend (``Program.__call__`` comes here)."""
    backend = get_backend(name)  # first: a missing library is a BackendError saying how to install it
    if name == "torch":
        from einflow.frameworks.torch_autograd import call as run
    else:
        from einflow.frameworks.jax_jvp import call as run
    return run(program, backend, values, optimize, memory_limit)


def function(program: Any, **options: Any) -> Callable[..., Any]:
    """``program`` as a function of positional arrays (in ``program.inputs`` order), for model code.

    Options (``backend=``, ``optimize=``, ...) are passed to every call. The function works on torch
    tensors (inside ``nn.Module.forward``, with autograd) and jax arrays (inside ``jax.jit``/``jax.grad``).

    >>> import torch, einflow as ef
    >>> from einflow.frameworks import function
    >>> affine = function(ef.compile("y[n,o] = x[n,i] W[o,i] + b[o]"))
    >>> affine(torch.ones(2, 3), torch.ones(4, 3), torch.zeros(4)).shape
    torch.Size([2, 4])
    """
    program = compile(program)
    names = program.info.inputs

    def apply(*arrays: Any, **named: Any) -> Any:
        if len(arrays) > len(names):
            raise EinflowError(f"this program reads {len(names)} tensors ({', '.join(names)}), "
                               f"{len(arrays)} were given")
        return program(dict(zip(names, arrays)), **named, **options)

    apply.__doc__ = f"einflow program ({', '.join(names)}):\n\n{program.text}"
    apply.__name__ = "einflow_function"
    apply.program = program  # type: ignore[attr-defined]
    return apply


FRAMEWORK_CALLS.update(torch=call, jax=call)  # Program's calls on torch tensors and jax arrays come here

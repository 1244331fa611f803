"""einflow: tensor algebra in index notation, with symbolic derivatives, planned by opt_einsum.

>>> import numpy as np, einflow as ef
>>> ef.evaluate("y[i] = A[i,j] x[j]", A=np.eye(2), x=np.array([1.0, 2.0])).tolist()
[1.0, 2.0]
"""

from einflow.engine.backends import get_default_backend, set_backend
from einflow.lang.errors import (
    ArgumentError,
    BackendError,
    DerivativeError,
    EinflowError,
    GatherIndexError,
    IndexRuleError,
    MatrixError,
    MemoryLimitError,
    ParseError,
    PathError,
    ShapeError,
    SparseError,
    SubscriptsError,
    TensorNameError,
)
from einflow.numpy_compat import einsum, einsum_path
from einflow.program import Program, compile, evaluate
from einflow.report import PlanReport

__version__ = "0.1.0"

__all__ = [
    "EinflowError",
    "ParseError",
    "ShapeError",
    "GatherIndexError",
    "IndexRuleError",
    "TensorNameError",
    "DerivativeError",
    "BackendError",
    "MemoryLimitError",
    "ArgumentError",
    "SubscriptsError",
    "PathError",
    "MatrixError",
    "SparseError",
    "Program",
    "PlanReport",
    "compile",
    "evaluate",
    "einsum",
    "einsum_path",
    "set_backend",
    "get_default_backend",
]

import einflow.frameworks  # noqa: E402,F401 - registers Program's runners for torch tensors and jax arrays
from einflow.derivatives import (  # noqa: E402
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
)

__all__ += ["grad", "jacobian", "hessian", "hessian_diagonal", "laplacian", "bilaplacian", "taylor", "vjp", "jvp",
            "hvp", "value_and_grad"]


def load_ipython_extension(ipython):  # type: ignore[no-untyped-def]
    """``%load_ext einflow`` in IPython or Jupyter: the ``%%einflow`` cell magic and friends (docs/notebook.md)."""
    from einflow.shell.notebook import load_ipython_extension as load

    load(ipython)

"""Per-example gradients and Hessians of an einflow loss with torch.func.

The loss of one example is an einflow program. ``torch.func.vmap(torch.func.grad(...))`` gives every
example's gradient (for per-example clipping, as in differentially private SGD) and
``torch.func.hessian`` the Hessian of one example's loss: einflow's symbolic derivative programs run
underneath (the VJP for grad, the JVP of the VJP for the Hessian), batched by an index under vmap.
Each result is checked against the same computation written in plain torch.

Run:  python examples/torch_func.py
"""

from __future__ import annotations

from typing import Any

import torch
from torch.func import grad, hessian, vmap

import einflow as ef

LOSS = ef.compile("""
h[k] = tanh(W[k,i] x[i] + b[k])
l = (v[k] h[k] - t)^2
""")


def loss(W: Any, b: Any, v: Any, x: Any, t: Any) -> Any:
    """One example's loss, by einflow."""
    return LOSS(W=W, b=b, v=v, x=x, t=t)


def plain_loss(W: Any, b: Any, v: Any, x: Any, t: Any) -> Any:
    """The same loss in torch operations (the reference)."""
    return (v @ torch.tanh(W @ x + b) - t) ** 2


def main() -> dict[str, float]:
    """Per-example gradients, clipped; one example's Hessian; the largest differences from plain torch."""
    generator = torch.Generator().manual_seed(0)
    features, hidden, examples = 5, 8, 32
    W = torch.randn(hidden, features, generator=generator, dtype=torch.float64) / features ** 0.5
    b = torch.zeros(hidden, dtype=torch.float64)
    v = torch.randn(hidden, generator=generator, dtype=torch.float64)
    X = torch.randn(examples, features, generator=generator, dtype=torch.float64)
    T = torch.randn(examples, generator=generator, dtype=torch.float64)

    batch = (None, None, None, 0, 0)  # parameters shared, one example per row of X and T
    per_example = vmap(grad(loss, argnums=(0, 1, 2)), in_dims=batch)(W, b, v, X, T)
    reference = vmap(grad(plain_loss, argnums=(0, 1, 2)), in_dims=batch)(W, b, v, X, T)
    gradient_error = max(float((a - r).abs().max()) for a, r in zip(per_example, reference))

    # clip each example's gradient to norm 1, then average: one step of per-example clipping
    norms = torch.sqrt(sum((g.reshape(examples, -1) ** 2).sum(dim=1) for g in per_example))
    scale = torch.clamp(1 / norms, max=1.0)
    clipped = [(g * scale.reshape(-1, *[1] * (g.dim() - 1))).mean(dim=0) for g in per_example]

    H = hessian(loss)(W, b, v, X[0], T[0])  # d2 l / dW2 for the first example: (8, 5, 8, 5)
    hessian_error = float((H - hessian(plain_loss)(W, b, v, X[0], T[0])).abs().max())

    print(f"per-example gradients: {examples} examples, dW {tuple(per_example[0].shape)}, "
          f"largest difference from plain torch.func {gradient_error:.1e}")
    print(f"gradient norms before clipping: min {float(norms.min()):.3f}, max {float(norms.max()):.3f}; "
          f"clipped mean gradient dW norm {float(clipped[0].norm()):.3f}")
    print(f"Hessian of one example's loss by W: {tuple(H.shape)}, largest difference {hessian_error:.1e}")
    return {"gradient_error": gradient_error, "hessian_error": hessian_error}


if __name__ == "__main__":
    main()

"""Newton's method in JAX with einflow's gradient and Hessian (L2-regularised logistic regression).

``ef.grad`` and ``ef.hessian`` derive the derivative programs symbolically; called on jax arrays inside
``jax.jit`` they run as jax.numpy code, so the whole Newton step is one compiled XLA function. The
result is checked against ``jax.grad`` / ``jax.hessian`` of the same loss written in jax.numpy.

Run:  python examples/jax_newton.py
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import einflow as ef  # noqa: E402

LOSS = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f]))) + lam / 2 * w[f] w[f]"
GRADIENT = ef.grad(LOSS, wrt="w")
HESSIAN = ef.hessian(LOSS, wrt="w")


@jax.jit
def newton_step(w: jax.Array, X: jax.Array, y: jax.Array, lam: float) -> jax.Array:
    g = GRADIENT(X=X, y=y, w=w, lam=lam)
    H = HESSIAN(X=X, y=y, w=w, lam=lam)
    return w - jnp.linalg.solve(H, g)


def loss_jnp(w: jax.Array, X: jax.Array, y: jax.Array, lam: float) -> jax.Array:
    return jnp.sum(jnp.logaddexp(0.0, -y * (X @ w))) + lam / 2 * w @ w


def main() -> None:
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.standard_normal((500, 10)))
    y = jnp.asarray(np.sign(X @ rng.standard_normal(10) + 0.5 * rng.standard_normal(500)))
    lam = 1.0
    w = jnp.zeros(10)
    print("Hessian program:")
    print(HESSIAN)
    h_diff = float(jnp.abs(HESSIAN(X=X, y=y, w=w, lam=lam) - jax.hessian(loss_jnp)(w, X, y, lam)).max())
    print(f"max Hessian difference vs jax.hessian: {h_diff:.3e}")
    for iteration in range(8):
        w = newton_step(w, X, y, lam)
        norm = float(jnp.linalg.norm(jax.grad(loss_jnp)(w, X, y, lam)))
        print(f"iteration {iteration}  loss {float(loss_jnp(w, X, y, lam)):.10f}  |grad| {norm:.3e}")
    print(f"final gradient norm: {norm:.3e}")


if __name__ == "__main__":
    main()

"""A physics-informed network for Poisson's equation, trained with einflow's per-sample Laplacian.

Solve ``-Δu = 2 π² sin(π x) sin(π y)`` on the unit square with ``u = 0`` on its edge; the exact solution is
``u = sin(π x) sin(π y)``. The network is a small tanh MLP times ``x (1 - x) y (1 - y)`` (zero on the edge);
``ef.laplacian(..., batch="b")`` gives the Laplacian at every collocation point ``b`` as an einflow program,
the residual loss is appended to that program's text, and ``ef.value_and_grad`` differentiates the whole
(a derivative of a derivative program) by the weights, for Adam steps.

Run:  python examples/pinn_poisson.py   (prints the loss and the relative L2 error against the exact solution)
"""

from __future__ import annotations

import numpy as np

import einflow as ef

NETWORK = """h1[b,j] = tanh(A[j] x[b] + B[j] y[b] + c1[j])
h2[b,m] = tanh(W2[m,j] h1[b,j] + c2[m])
u[b] = v[m] h2[b,m] x[b] (1 - x[b]) y[b] (1 - y[b])"""

WEIGHTS = ["A", "B", "c1", "W2", "c2", "v"]


def train(steps: int = 600, points: int = 64, width: int = 16, seed: int = 0) -> tuple[float, float, float]:
    """Train the network; returns (final loss, relative L2 error on a test grid, the largest difference of the
    Laplacian from central differences of the network at the test points)."""
    rng = np.random.default_rng(seed)
    laplacian = ef.laplacian(NETWORK, wrt=["x", "y"], batch="b")  # d2u/dx2 + d2u/dy2 at every point b
    # the residual loss, appended to the Laplacian program's own text: the mean of (Δu + f)^2
    loss_text = f"{laplacian}\nL = sum[b]((laplacian_u[b] + f[b])^2) / {points}"
    step = ef.value_and_grad(loss_text, wrt=WEIGHTS)
    network = ef.compile(NETWORK)
    params = {"A": rng.normal(size=width), "B": rng.normal(size=width), "c1": np.zeros(width),
              "W2": rng.normal(size=(width, width)) / np.sqrt(width), "c2": np.zeros(width),
              "v": rng.normal(size=width) / np.sqrt(width)}
    moments = {k: (np.zeros_like(p), np.zeros_like(p)) for k, p in params.items()}
    loss = float("nan")
    for t in range(1, steps + 1):
        x, y = rng.uniform(size=(2, points))
        f = 2 * np.pi ** 2 * np.sin(np.pi * x) * np.sin(np.pi * y)
        loss, grads = step(**params, x=x, y=y, f=f)
        for name, g in zip(WEIGHTS, grads):  # Adam, learning rate 1e-2
            m, s = moments[name]
            m = 0.9 * m + 0.1 * g
            s = 0.999 * s + 0.001 * g * g
            moments[name] = (m, s)
            params[name] = params[name] - 1e-2 * (m / (1 - 0.9 ** t)) / (np.sqrt(s / (1 - 0.999 ** t)) + 1e-8)
    x, y = (g.ravel() for g in np.meshgrid(np.linspace(0, 1, 21), np.linspace(0, 1, 21)))
    exact = np.sin(np.pi * x) * np.sin(np.pi * y)
    predicted = network(**params, x=x, y=y)
    h = 1e-4  # the Laplacian against central differences of the network itself
    finite = sum(network(**params, **{"x": x, "y": y, axis: value + s * h}) for axis, value in (("x", x), ("y", y))
                 for s in (1, -1)) / h ** 2 - 4 * predicted / h ** 2
    difference = float(np.max(np.abs(laplacian(**params, x=x, y=y) - finite)))
    return float(loss), float(np.linalg.norm(predicted - exact) / np.linalg.norm(exact)), difference


if __name__ == "__main__":
    final, error, difference = train()
    print(f"final loss {final:.3e}, relative L2 error against sin(pi x) sin(pi y): {error:.3%}")
    print(f"the Laplacian and central differences of the network agree to {difference:.1e}")

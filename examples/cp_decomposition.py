"""CP decomposition of a synthetic rank-3 tensor by gradient steps, with einflow's gradients.

T[i,j,k] = sum_r A[i,r] B[j,r] C[k,r] for random rank-3 factors; starting from random factors,
Adam steps (with a decaying step size) on the squared reconstruction error, the gradients with
respect to A, B and C coming from one einflow program, recover a rank-3 fit whose relative error
is printed as it falls.

Run:  python examples/cp_decomposition.py
"""

from __future__ import annotations

import numpy as np

import einflow as ef

LOSS = "L = sum[i,j,k]((A[i,r] B[j,r] C[k,r] - T[i,j,k])^2)"
RANK = 3


def main(steps: int = 1000, learning_rate: float = 0.05, shape: tuple[int, int, int] = (10, 12, 14)) -> None:
    rng = np.random.default_rng(0)
    truth = [rng.standard_normal((size, RANK)) for size in shape]
    T = ef.evaluate("T[i,j,k] = A[i,r] B[j,r] C[k,r]", A=truth[0], B=truth[1], C=truth[2])
    reference = np.einsum("ir,jr,kr->ijk", *truth)
    assert np.allclose(T, reference)

    value_and_grad = ef.value_and_grad(LOSS, wrt=["A", "B", "C"])
    print("gradient program:")
    print(value_and_grad)
    print()
    factors = {name: 0.5 * rng.standard_normal((size, RANK)) for name, size in zip("ABC", shape)}
    first = {name: np.zeros_like(value) for name, value in factors.items()}
    second = {name: np.zeros_like(value) for name, value in factors.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-12
    norm = float(np.sum(T**2))
    errors = []
    for step in range(1, steps + 1):
        loss, gradients = value_and_grad(T=T, **factors)
        errors.append(np.sqrt(float(loss) / norm))
        for name, gradient in zip("ABC", gradients):
            first[name] = beta1 * first[name] + (1 - beta1) * gradient
            second[name] = beta2 * second[name] + (1 - beta2) * gradient**2
            corrected = first[name] / (1 - beta1**step), second[name] / (1 - beta2**step)
            # the step size decays 10x over the run, so Adam settles instead of oscillating
            rate = learning_rate * 0.1 ** (step / steps)
            factors[name] = factors[name] - rate * corrected[0] / (np.sqrt(corrected[1]) + eps)
        if step == 1 or step % 100 == 0:
            print(f"step {step:5d}  relative reconstruction error {errors[-1]:.3e}")
    fitted = np.einsum("ir,jr,kr->ijk", factors["A"], factors["B"], factors["C"])
    final = np.linalg.norm(fitted - T) / np.linalg.norm(T)
    print(f"\ninitial relative error {errors[0]:.3e}, final relative error {final:.3e}")


if __name__ == "__main__":
    main()

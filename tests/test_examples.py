"""Run every script in examples/ and check the facts each one prints against independent references."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = ["newton_logistic", "two_layer_net", "cp_decomposition", "attention", "tensor_network", "dask_vs_numpy",
           "gaussian_process", "tv_denoise", "pinn_poisson", "mps_ground_state", "sparse_cp"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outputs() -> dict[str, subprocess.CompletedProcess[str]]:
    """Run the (independent) examples two at a time; each must finish well within a minute."""
    def run(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], cwd=EXAMPLES.parent,
                              capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(SCRIPTS, pool.map(run, SCRIPTS)))


def _run(outputs: dict[str, subprocess.CompletedProcess[str]], name: str) -> str:
    result = outputs[name]
    assert result.returncode == 0, result.stderr
    return result.stdout


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match is not None, f"{pattern!r} not in output:\n{text}"
    return float(match.group(1))


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_newton_beats_gradient_descent(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "newton_logistic")
    newton_steps = _number(r"newton: converged in (\d+) iterations", text)
    gd_steps = _number(r"gradient descent: converged in (\d+) iterations", text)
    newton_loss = _number(r"newton: .*final loss ([\d.]+)", text)
    gd_loss = _number(r"gradient descent: .*final loss ([\d.]+)", text)
    assert newton_steps <= 10
    assert 10 * newton_steps < gd_steps < _load("newton_logistic").MAX_GD_STEPS
    # independent reference: Newton's method with the textbook gradient and Hessian, in plain numpy
    X, y = _load("newton_logistic").make_data()
    samples, lam = len(y), 1e-3
    w = np.zeros(X.shape[1])
    for _ in range(30):
        margin = y * (X @ w)
        p = 1.0 / (1.0 + np.exp(margin))  # sigma(-margin)
        gradient = -X.T @ (y * p) / samples + lam * w
        hessian = (X.T * (p * (1 - p))) @ X / samples + lam * np.eye(X.shape[1])
        w -= np.linalg.solve(hessian, gradient)
    optimum = np.mean(np.log1p(np.exp(-y * (X @ w)))) + 0.5 * lam * w @ w
    assert newton_loss == pytest.approx(optimum, abs=1e-11)
    assert gd_loss == pytest.approx(optimum, abs=1e-11)


def test_two_layer_net_loss_curve_falls(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "two_layer_net")
    curve = [(int(step), float(loss)) for step, loss in re.findall(r"step\s+(\d+)\s+loss ([\d.]+)", text)]
    assert [step for step, _ in curve[:3]] == [1, 100, 200] and len(curve) >= 10
    losses = [loss for _, loss in curve]
    assert losses[-1] < losses[0] / 100
    assert all(later <= earlier * 1.05 for earlier, later in zip(losses, losses[1:]))
    assert _number(r"explains ([\d.]+)% of it", text) > 99.0
    assert "dL_dW1" in text and "dL_db1" in text  # the printed gradient program


def test_sparse_cp_fits_held_out_entries_with_nnz_flops(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "sparse_cp")
    assert _number(r"final held-out relative error: ([\d.]+)", text) < 0.01
    flops = _number(r"total FLOPs: (\d+)", text.replace(",", ""))
    dense = _number(r"dense loss would need about (\d+)", text.replace(",", ""))
    assert flops < dense / 10
    # the graph layer's order of contraction follows nnz: H W first with many neighbours, a gather of H with few
    assert "first step contract [j,f] [f,g] -> [j,g]" in text and "first step window H[" in text


def test_cp_decomposition_recovers_the_tensor(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "cp_decomposition")
    assert _number(r"initial relative error ([\d.e+-]+)", text) > 0.5
    assert _number(r"final relative error ([\d.e+-]+)", text) < 1e-8
    errors = [float(e) for e in re.findall(r"relative reconstruction error ([\d.e+-]+)", text)]
    assert len(errors) >= 5 and errors[-1] < errors[len(errors) // 2] < errors[0]


def test_attention_gradients_match_finite_differences(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "attention")
    assert _number(r"numpy reference [\d.]+, difference ([\d.e+-]+)", text) < 1e-12
    for name in ("Q", "K", "V"):
        assert _number(rf"dL/d{name}: .*finite differences ([\d.e+-]+)", text) < 1e-6
    assert "A[q,k] = softmax[k](S[q,k])" in text
    assert re.search(r"scores up to 9\d\d: .* gradients finite: True", text)


def test_tensor_network_plan_saves_flops(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "tensor_network")
    value = _number(r"<psi\|psi> = ([\d.e+-]+)", text)
    reference = _number(r"transfer-matrix reference ([\d.e+-]+)", text)
    assert value == pytest.approx(reference, rel=1e-10)
    planned = _number(r"einflow plan: ([\d.e+-]+) FLOPs", text)
    naive = _number(r"naive single loop over all \d+ indices: ([\d.e+-]+) FLOPs", text)
    written = _number(r"pairwise in written order: ([\d.e+-]+) FLOPs", text)
    assert naive / planned > 1e15
    assert written > planned
    assert "total FLOPs" in text and "pairwise" in text  # the plan report itself is printed


def test_dask_and_numpy_agree(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "dask_vs_numpy")
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        assert "skipping" in text
        pytest.skip("dask is not installed: the example only reports that it skips")
    assert "results agree" in text, text
    assert _number(r"max \|dask - numpy\| = ([\d.e+-]+)", text) < 1e-9
    assert _number(r"tasks on (\d+) workers", text) >= 1


def test_mps_ground_state_reaches_the_exact_energy(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "mps_ground_state")  # complex MPS, gradient descent in PyTorch's convention
    exact = _number(r"exact ground energy ([-\d.]+)", text)
    assert abs(_number(r"MPS energy ([-\d.]+)", text) - exact) < 1e-3 * abs(exact)


def test_gaussian_process_fits_its_kernel(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "gaussian_process")
    assert _number(r"central differences agree to ([\d.e+-]+)", text) < 1e-6
    assert abs(_number(r"noise ([\d.]+) \(true", text) - 0.1) < 0.02
    assert abs(_number(r"length ([\d.]+) \(true", text) - 0.8) < 0.2
    assert "= inv[i,j](K[i,j])" in text  # the gradient program is printed as einflow text (K^-1 named once)


def test_tv_denoising_removes_noise_with_a_right_stencil_gradient(
        outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "tv_denoise")
    assert _number(r"central differences agree to ([\d.e+-]+)", text) < 1e-6
    noisy = _number(r"error against the clean image: ([\d.]+) noisy", text)
    denoised = _number(r"noisy, ([\d.]+) denoised", text)
    assert denoised < 0.5 * noisy  # (0.200 -> 0.073 here)
    assert re.search(r"delta\[p, a\d* \+ 1\]", text)  # the gradient printed as einflow text, scatters as deltas


def test_pinn_poisson_learns_the_analytic_solution(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    text = _run(outputs, "pinn_poisson")
    assert _number(r"relative L2 error against sin\(pi x\) sin\(pi y\): ([\d.]+)%", text) < 3  # (0.5% here)
    assert _number(r"central differences of the network agree to ([\d.e+-]+)", text) < 1e-3

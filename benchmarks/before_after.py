"""The same workloads on two checkouts of einflow, paired: did a change make anything slower?

Each round runs one child process per checkout (the order alternates from round to round); a child
imports its checkout's einflow and reports the median wall time and process CPU time of each workload.
The table gives, per workload, the median over rounds of each side and their ratio (after / before).

Run:  python benchmarks/before_after.py BEFORE_CHECKOUT [AFTER_CHECKOUT] [--rounds 5]
(AFTER defaults to this checkout; e.g. ``git worktree add /tmp/before <commit>`` for BEFORE.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import einflow as ef

rng = np.random.default_rng(0)
small = {"A": rng.normal(size=(4, 4)), "B": rng.normal(size=(4, 4))}
chain = dict(A=rng.normal(size=(30, 40)), B=rng.normal(size=(40, 50)), C=rng.normal(size=(50, 60)),
             D=rng.normal(size=(60, 70)), v=rng.normal(size=70))
mlp = "h[j] = tanh(W1[j,k] x[k])\nL = 0.5 * sum[i]((W2[i,j] h[j] - t[i])^2)"
mlp_big = dict(W1=rng.normal(size=(512, 256)), x=rng.normal(size=256), W2=rng.normal(size=(64, 512)),
               t=rng.normal(size=64))
batch = dict(X=rng.normal(size=(256, 48)), W=rng.normal(size=(48, 48)), y=rng.normal(size=(256, 48)))
counter = [0]

def fresh(text):  # the last statement's target renamed, so that nothing is cached
    counter[0] += 1
    head, _, last = text.rpartition("\n")
    name = last.split("[")[0].split("=")[0].strip()
    return (head + "\n" if head else "") + name + str(counter[0]) + last[len(name):]

matmul = ef.compile("C[i,j] = A[i,k] B[k,j]")
grad_mlp = ef.grad(mlp, wrt=["W1", "W2"])
hess = ef.hessian("L = sum[n,j]((X[n,i] W[i,j] - y[n,j])^2)", wrt="W")
work = {
    "call of a 4x4 matmul (us)": (lambda: matmul(**small), 1e6, 2000),
    "first call of a 5-operand chain (ms)": (
        lambda: ef.compile(fresh("y[i] = A[i,j] B[j,k] C[k,l] D[l,m] v[m]"))(**chain), 1e3, 30),
    "grad of a 2-layer MLP: derivation (ms)": (lambda: ef.grad(fresh(mlp), wrt=["W1", "W2"]), 1e3, 30),
    "hessian of least squares by W: derivation (ms)": (
        lambda: ef.hessian(fresh("L = sum[n,j]((X[n,i] W[i,j] - y[n,j])^2)"), wrt="W"), 1e3, 30),
    "first plan under a memory limit, sliced 3-matrix chain (ms)": (
        lambda: ef.compile(fresh("C[i,j] = A[i,k] B[k,l] D[l,j]")).plan(
            {"A": (300, 200), "B": (200, 250), "D": (250, 300)}, memory_limit=1_000_000), 1e3, 30),
    "MLP gradient call, 512x256 (ms)": (lambda: grad_mlp(**mlp_big), 1e3, 200),
    "least-squares Hessian call, (48x48)^2 (ms)": (lambda: hess(**batch), 1e3, 20),
}
out = {}
for name, (action, unit, repeat) in work.items():
    action()
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        action()
        walls.append((time.perf_counter() - w) * unit)
        cpus.append((time.process_time() - c) * unit)
    out[name] = (statistics.median(walls), statistics.median(cpus))
print(json.dumps(out))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[dict[str, list[float]]]] = {"before": [], "after": []}
    for round_number in range(args.rounds):
        sides = ["before", "after"] if round_number % 2 == 0 else ["after", "before"]
        for side in sides:
            path = getattr(args, side)
            done = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, check=True,
                                  cwd="/")
            results[side].append(json.loads(done.stdout))
    names = list(results["before"][0])
    print("| workload | before (wall / CPU) | after (wall / CPU) | after / before (wall, CPU) |")
    print("|---|---|---|---|")
    for name in names:
        row = []
        for side in ("before", "after"):
            walls = [r[name][0] for r in results[side]]
            cpus = [r[name][1] for r in results[side]]
            row.append((statistics.median(walls), statistics.median(cpus)))
        (bw, bc), (aw, ac) = row
        print(f"| {name} | {bw:.3g} / {bc:.3g} | {aw:.3g} / {ac:.3g} | {aw / bw:.2f}x, {ac / bc:.2f}x |")


if __name__ == "__main__":
    main()

"""Train a two-layer network in PyTorch whose loss, and its gradient, come from einflow.

The model and the loss are one einflow program. Called on torch tensors that require grad, it returns
a tensor in the autograd graph; ``loss.backward()`` runs einflow's VJP program (derived symbolically,
once) with torch ops, and ``torch.optim.Adam`` does the rest, as with any torch model.

Run:  python examples/torch_training.py
"""

from __future__ import annotations

import torch

import einflow as ef
from einflow.frameworks import function

NETWORK = """
H[n,h] = tanh(X[n,f] W1[f,h] + b1[h])
P[n] = H[n,h] w2[h] + c
L = sum[n]((P[n] - t[n])^2) / N
"""


class TwoLayer(torch.nn.Module):
    """An nn.Module whose forward pass (and loss) is the einflow program above."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.W1 = torch.nn.Parameter(torch.randn(features, hidden, dtype=torch.float64) / features ** 0.5)
        self.b1 = torch.nn.Parameter(torch.zeros(hidden, dtype=torch.float64))
        self.w2 = torch.nn.Parameter(torch.randn(hidden, dtype=torch.float64) / hidden ** 0.5)
        self.c = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.loss = function(ef.compile(NETWORK))  # positional arguments in the program's input order

    def forward(self, X: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        assert self.loss.program.inputs == ("X", "W1", "b1", "w2", "c", "t", "N")
        return self.loss(X, self.W1, self.b1, self.w2, self.c, t, len(t))


def main(steps: int = 300) -> None:
    torch.manual_seed(0)
    X = torch.rand(256, 4, dtype=torch.float64) * 4 - 2
    t = torch.sin(X @ torch.randn(4, 3, dtype=torch.float64)).sum(dim=1)
    model = TwoLayer(4, 32)
    # the gradient einflow gives equals torch's own autograd of the same model
    loss = model(X, t)
    mine = torch.autograd.grad(loss, list(model.parameters()))
    H = torch.tanh(X @ model.W1 + model.b1)
    reference = torch.autograd.grad(((H @ model.w2 + model.c - t) ** 2).mean(), list(model.parameters()))
    difference = max(float((a - b).abs().max()) for a, b in zip(mine, reference))
    print(f"backward node: {loss.grad_fn.name()}")
    print(f"max gradient difference vs torch autograd: {difference:.3e}")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    first = loss.item()
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(X, t)
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.5f}")
    print(f"initial loss: {first:.5f}")
    print(f"final loss: {model(X, t).item():.5f}")


if __name__ == "__main__":
    main()

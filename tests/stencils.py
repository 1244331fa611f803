"""Random programs of shifted, windowed and gathered reads in one to three dimensions, with a reference.

Each program is written twice: as einflow text, and as a function of jax arrays built from plain slices
(``U[1:1+na, 2:2+nb]``) and fancy indexing, where every range is the intersection of what the statement's
reads allow (LANGUAGE.md 8.2). Nothing here calls einflow. The families drawn are those the first
differential generator (``randprog``, one shifted axis per read) never produced:

* ``stencil``: one input read at several positions on every axis at once (``U[a+1, b+2] - 4 U[a+1, b+1]``;
  shifted, strided ``2*a``, reversed ``3 - a``, a constant row ``U[1, b]``, zero-padded under ``size``
  or padded by ``pad circular|reflect|replicate U``), a weighted combination, plain reads of other inputs of
  other lengths beside it (``V[a,b]``), an elementwise function, a reduction over one axis inside it, a weight
  tensor over the stencil's indices;
* ``window``: an elementwise function of a window before its contraction (``tanh(x[a + r, b]) k[r]``),
  or a ``mean``/``max``/``logsumexp``/``softmax`` over the window's index;
* ``gather``: a ``mean``/``max``/``sum`` over gathered rows (``mean[s](E[t1[b,s], d])``), the gather tensor
  named like a derivative helper (``t1``, ``t2``); ``scatter``: a scatter-add ``delta[v, t1[b]] G[b,d]``;

and in each: a Python-float scalar factor, a declaration as the last line, and an input the value does not
depend on (``sign(c[m])``, whose derivative is zero) that the derivatives are taken by too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Family", "generate_family"]

_AXES = ("a", "b", "e")
#: ``pad`` modes and numpy.pad's (jnp.pad's) names for them
_PAD_MODES = ("zeros", "circular", "reflect", "replicate")
_NUMPY_PAD = {"zeros": "constant", "circular": "wrap", "reflect": "reflect", "replicate": "edge"}


@dataclass(frozen=True)
class Family:
    text: str
    shapes: dict[str, tuple[int, ...]]
    reference: Any  # (dict of jax arrays; Python floats for scalars) -> scalar
    wrt: tuple[str, ...]
    integers: dict[str, np.ndarray] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)

    def arrays(self, seed: int) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        arrays: dict[str, Any] = {name: rng.uniform(-1.0, 1.0, size=shape) for name, shape in self.shapes.items()}
        return {**arrays, **self.integers, **self.scalars}


def _position(index: str, offset: int) -> str:
    if offset == 0:
        return index
    return f"{index} + {offset}" if offset > 0 else f"{index} - {-offset}"


def _combination(terms: list[tuple[float, str]]) -> str:
    text = " ".join(("+ " if c > 0 else "- ") + (f"{abs(c):g} " if abs(c) != 1 else "") + read for c, read in terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def _apply(function: str, inner: str) -> str:
    if function == "square":
        return f"{inner}^2"
    if function == "tanh":
        return f"tanh({inner})"
    if function == "sqrt":
        return f"sqrt({inner}^2 + 0.5)"
    return inner


def _reference_apply(jnp: Any, function: str, value: Any) -> Any:
    if function == "square":
        return value ** 2
    if function == "tanh":
        return jnp.tanh(value)
    if function == "sqrt":
        return jnp.sqrt(value ** 2 + 0.5)
    return value


def _stencil(r: random.Random) -> tuple[str, dict[str, tuple[int, ...]], Any]:
    """Several reads of ``U`` at positions ``c*i + o`` on every axis (``c`` 1, 2 or -1: shifted, strided,
    reversed), one of them perhaps at a constant position on one axis, perhaps zero-padded ("same" ranges
    declared with ``size``)."""
    import jax.numpy as jnp

    rank = r.choice((1, 2, 2, 2, 3))
    axes = _AXES[:rank]
    shape = tuple(r.randint(4, 6) for _ in axes)
    count = r.randint(2, 5)
    padded = r.random() < 0.2
    coefficients = [1 if padded else r.choice((1, 1, 1, 2, -1)) for _ in axes]  # one per axis, as in a stencil
    if padded:  # zero padding: each axis as long as U's, offsets -1..1
        offsets = [tuple(r.randint(-1, 1) for _ in axes) for _ in range(count)]
        lengths = list(shape)
    else:
        offsets = [tuple(r.randint(0, 2) + (shape[k] - 1 if coefficients[k] < 0 else 0) - (2 if coefficients[k] < 0
                                                                                          else 0)
                         for k in range(rank)) for _ in range(count)]
    constant = rank >= 2 and not padded and r.random() < 0.25  # the first read at a constant position on axis 0
    if not padded:
        lengths = []
        for k in range(rank):  # the intersection of what every read allows
            c = coefficients[k]
            lengths.append(min((shape[k] - 1 - o[k]) // c + 1 if c > 0 else o[k] + 1
                               for n, o in enumerate(offsets) if not (constant and n == 0 and k == 0)))
    weights = [r.choice((1, -1, 2, -4, 0.5)) for _ in range(count)]
    function = r.choice(("square", "tanh", "none", "sqrt"))
    weighted = r.random() < 0.3
    plain = r.random() < 0.25 and not padded
    reduce_axis = rank >= 2 and r.random() < 0.2
    shapes: dict[str, tuple[int, ...]] = {"U": shape}

    def position(k: int, offset: int) -> str:
        c, index = coefficients[k], axes[k]
        head = index if c == 1 else f"2*{index}" if c == 2 else f"-{index}"
        if c < 0:
            return f"{offset} - {index}"
        return head if offset == 0 else f"{head} + {offset}" if offset > 0 else f"{head} - {-offset}"

    reads = []
    for n, offset in enumerate(offsets):
        parts = [position(k, o) for k, o in enumerate(offset)]
        if constant and n == 0:
            parts[0] = "1"
        reads.append("U[" + ", ".join(parts) + "]")
    body = _combination(list(zip(weights, reads)))
    if plain:  # a plain read as long as the range, or longer (the intersection then is the range)
        # an axis some read shifts (the read at a constant position does not read the index: seeds 24932, 24980
        # drew a V longer than U on an axis only read plainly, which is a shape error, not a program)
        shifted = [coefficients[k] != 1 or any(o[k] for n, o in enumerate(offsets)
                                               if not (constant and n == 0 and k == 0))
                   for k in range(rank)]  # else plain only
        shapes["V"] = tuple(n + (r.choice((0, 0, 1)) if shifted[k] else 0) for k, n in enumerate(lengths))
        body += " + V[" + ", ".join(axes) + "]"
    inner = f"({body})"
    outer = axes[:-1] if reduce_axis else axes
    if reduce_axis:
        inner = f"sum[{axes[-1]}]{inner}"
    value = _apply(function, inner)
    if weighted:
        shapes["w"] = tuple(lengths[: len(outer)])
        value = f"w[{', '.join(outer)}] {value}"
    text = f"L = sum[{','.join(outer)}]({value})"
    # the boundary of a padded stencil (LANGUAGE.md 9.4), chosen from the draws already made, so that every
    # other program stays the one it was
    mode = _PAD_MODES[(count + sum(shape)) % len(_PAD_MODES)] if padded else "zeros"
    if padded:
        text = "".join(f"size {i} = {n}\n" for i, n in zip(axes, lengths)) + text
    if mode != "zeros":
        text = f"pad {mode} U\n" + text

    def reference(arrays: dict[str, Any]) -> Any:
        U = jnp.pad(arrays["U"], 1, mode=_NUMPY_PAD[mode]) if padded else arrays["U"]
        shift = 1 if padded else 0
        total = 0.0
        for n, (weight, offset) in enumerate(zip(weights, offsets)):
            where = [coefficients[k] * jnp.arange(lengths[k]) + offset[k] + shift for k in range(rank)]
            if constant and n == 0:
                where[0] = jnp.full(lengths[0], 1)
            total = total + weight * U[jnp.ix_(*where)]
        if plain:
            total = total + arrays["V"][tuple(slice(0, n) for n in lengths)]
        if reduce_axis:
            total = jnp.sum(total, axis=-1)
        total = _reference_apply(jnp, function, total)
        if weighted:
            total = arrays["w"] * total
        return jnp.sum(total)

    return text, shapes, reference


def _window(r: random.Random) -> tuple[str, dict[str, tuple[int, ...]], Any]:
    """``sum[a,b,r](f(x[a + d*r, b]) k[r])`` or a reduction over the window: ``g(max[r](x[a + r, b]))``."""
    import jax
    import jax.numpy as jnp

    kernel = r.randint(2, 3)
    dilation = r.choice((1, 1, 2))
    two = r.random() < 0.5  # a second, plain axis beside the window's
    length = r.randint(kernel * dilation, 7)
    rows = length - dilation * (kernel - 1)
    shapes: dict[str, tuple[int, ...]] = {"x": (length, 3) if two else (length,)}
    read = f"x[{'a + ' + (str(dilation) + '*') * (dilation != 1) + 'r'}{', b' if two else ''}]"
    outer = "a,b" if two else "a"
    kind = r.choice(("product", "product", "mean", "max", "logsumexp", "softmax"))
    function = r.choice(("tanh", "square", "none"))
    windows = [slice(j * dilation, j * dilation + rows) for j in range(kernel)]
    if kind == "product":
        shapes["k"] = (kernel,)
        text = f"L = sum[{outer},r]({_apply(function, read)} k[r])"
    elif kind == "softmax":  # a normaliser over the window, weighted by k
        shapes["k"] = (kernel,)
        text = f"L = sum[{outer},r](k[r] {_apply(function, f'softmax[r]({read})')})"
    else:
        size = f"size r = {kernel}\n"
        text = size + f"L = sum[{outer}]({_apply(function, f'{kind}[r]({read})')})"

    def reference(arrays: dict[str, Any]) -> Any:
        stacked = jnp.stack([arrays["x"][w] for w in windows], axis=-1)  # [a, (b,) r]
        if kind == "product":
            return jnp.sum(_reference_apply(jnp, function, stacked) * arrays["k"])
        if kind == "softmax":
            return jnp.sum(arrays["k"] * _reference_apply(jnp, function, jax.nn.softmax(stacked, axis=-1)))
        reduced = {"mean": jnp.mean, "max": jnp.max, "logsumexp": jax.nn.logsumexp}[kind](stacked, axis=-1)
        return jnp.sum(_reference_apply(jnp, function, reduced))

    return text, shapes, reference


def _gather(r: random.Random) -> tuple[str, dict[str, tuple[int, ...]], Any, dict[str, np.ndarray]]:
    """``sum[b,d](f(mean[s](E[t1[b,s], d])))``: a reduction over gathered rows; the gather tensor named ``t1``."""
    import jax
    import jax.numpy as jnp

    rows, width, batch, count = r.randint(3, 5), r.randint(1, 3), r.randint(1, 3), r.randint(1, 3)
    name = r.choice(("t1", "t2", "tok"))
    positions = np.array([[r.randrange(rows) for _ in range(count)] for _ in range(batch)])
    kind = r.choice(("mean", "sum", "max", "logsumexp"))
    function = r.choice(("square", "tanh", "none"))
    shapes = {"E": (rows, width)}
    text = f"L = sum[b,d]({_apply(function, f'{kind}[s](E[{name}[b,s], d])')})"

    def reference(arrays: dict[str, Any]) -> Any:
        gathered = arrays["E"][positions]  # [b, s, d]
        reduced = {"mean": jnp.mean, "sum": jnp.sum, "max": jnp.max, "logsumexp": jax.nn.logsumexp}[kind](gathered,
                                                                                                     axis=1)
        return jnp.sum(_reference_apply(jnp, function, reduced))

    return text, shapes, reference, {name: positions}


def _scatter(r: random.Random) -> tuple[str, dict[str, tuple[int, ...]], Any, dict[str, np.ndarray]]:
    """``h[v,d] = E[v,d] + sum[b](delta[v, t1[b]] G[b,d])``: a scatter-add (repeated positions add up), then a
    loss of ``h``."""
    import jax.numpy as jnp

    rows, width, count = r.randint(2, 4), r.randint(1, 3), r.randint(1, 5)
    name = r.choice(("t1", "t3", "idx"))
    positions = np.array([r.randrange(rows) for _ in range(count)])
    function = r.choice(("square", "tanh", "sqrt"))
    shapes = {"G": (count, width), "E": (rows, width)}
    text = (f"h[v,d] = E[v,d] + sum[b](delta[v, {name}[b]] G[b,d])\n"
            f"L = sum[v,d]({_apply(function, '(h[v,d])')})")

    def reference(arrays: dict[str, Any]) -> Any:
        h = arrays["E"] + jnp.zeros((rows, width)).at[positions].add(arrays["G"])
        return jnp.sum(_reference_apply(jnp, function, h))

    return text, shapes, reference, {name: positions}


def generate_family(seed: int) -> Family:
    """A random program of one of the families (module docstring), with its reference and ``wrt`` inputs."""
    import jax.numpy as jnp

    r = random.Random(seed)
    kind = r.choice(("stencil", "stencil", "stencil", "window", "window", "gather", "scatter"))
    integers: dict[str, np.ndarray] = {}
    if kind == "stencil":
        text, shapes, base = _stencil(r)
    elif kind == "window":
        text, shapes, base = _window(r)
    elif kind == "gather":
        text, shapes, base, integers = _gather(r)
    else:
        text, shapes, base, integers = _scatter(r)
    scalars: dict[str, float] = {}
    scaled = r.random() < 0.3  # a Python-float scalar factor: the hyper-parameter of the loss
    unused = r.random() < 0.25  # an input whose derivative is zero: sign(c[m])
    lines = text.split("\n")
    if scaled:
        scalars["s"] = r.choice((0.5, 1.5, -2.0))
        lines[-1] = lines[-1].replace("L = ", "L = s * ", 1)
    if unused:
        shapes["c"] = (3,)
        lines[-1] += " + sum[m](sign(c[m]))"
    if r.random() < 0.2:  # a declaration as the last line
        first = next(iter(shapes))
        lines.append("size " + ", ".join(f"z{k}" for k in range(len(shapes[first]))) + f" = {first}")
    text = "\n".join(lines)

    def reference(arrays: dict[str, Any]) -> Any:
        value = base(arrays)
        if scaled:
            value = arrays["s"] * value
        if unused:
            value = value + jnp.sum(jnp.sign(arrays["c"]))
        return value

    wrt = tuple(shapes) + tuple(scalars)
    return Family(text, shapes, reference, wrt, integers, scalars)

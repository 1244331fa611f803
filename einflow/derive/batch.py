"""Batch indices (LANGUAGE.md §9.1): derivatives that keep independent samples apart.

An index that follows one axis of every ``wrt`` input through the program, and that no statement sums,
normalises, shifts or gathers along, indexes independent samples: the derivative of sample ``b``'s value by
sample ``c``'s input is zero unless ``b = c``. Such a derivative is derived once per sample: the batch axes
are taken out of every tensor that carries them (:func:`strip`), the per-sample program is differentiated as
usual, and the batch axes are put back into every statement that reads a batched tensor (:func:`restore`).
No statement of the result holds two copies of a batch index, so work and memory grow linearly in it.

>>> from einflow.lang.check import checked
>>> from einflow.lang.grammar import parse
>>> program = checked(parse("h[b,j] = tanh(W[j,k] x[b,k])\\nf[b] = v[j] h[b,j]"))
>>> batch = follow(program, ("b",), ["x"], "hessian")
>>> batch.axes["x"], batch.axes["h"], batch.axes["f"]
({'b': 0}, {'b': 0}, {'b': 0})
>>> print(ir.format_program(strip(program, batch).ir))
h[j] = tanh(W[j,k] x[k])
f = v[j] h[j]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from einflow.derive.normal import all_index_names
from einflow.lang import ir
from einflow.lang.check import Checked, checked
from einflow.lang.errors import DerivativeError
from einflow.lang.indices import free_indices

__all__ = ["Batch", "follow", "strip", "restore", "batch_names", "summed_batch"]


@dataclass(frozen=True)
class Batch:
    """The batch indices (the output's names) and, for every tensor carrying one, its axis per batch index."""

    names: tuple[str, ...]
    axes: dict[str, dict[str, int]] = field(default_factory=dict)
    #: every tensor's rank in the source program (batch axes included)
    ranks: dict[str, int] = field(default_factory=dict)
    #: the source program's inputs (what a size declaration reads)
    inputs: tuple[str, ...] = ()
    #: positions of the statements the value does not read
    dead: frozenset[int] = frozenset()

    def of(self, tensor: str) -> dict[str, int]:
        return self.axes.get(tensor, {})


def batch_names(batch: str | tuple[str, ...] | list[str] | None, what: str) -> tuple[str, ...]:
    """``batch=`` as a tuple of index names (empty for None)."""
    if batch is None:
        return ()
    names = (batch,) if isinstance(batch, str) else tuple(batch)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise DerivativeError(f"{what}: batch= must name an index of the output or list such names, got {batch!r}")
    if len(set(names)) != len(names):
        raise DerivativeError(f"{what}: batch= names an index twice")
    return names


def _last(program: ir.ProgramIR) -> int:
    return max(k for k, s in enumerate(program.statements) if isinstance(s, ir.Assign))


def _output_indices(statement: ir.Assign) -> tuple[str, ...]:
    return statement.indices if statement.indices is not None else free_indices(statement.expr)


def follow(program: Checked, names: tuple[str, ...], wrt: list[str], what: str) -> Batch:
    """Each batch index followed from the program's value back to the inputs: the axis every tensor carries it
    on; a DerivativeError names an index that is not the output's, that a statement mixes samples along, or
    that does not follow an axis of every ``wrt`` input."""
    statements = program.ir.statements
    last = _last(program.ir)
    final = statements[last]
    assert isinstance(final, ir.Assign)
    value = final.target
    outputs = _output_indices(final)
    for name in names:
        if name not in outputs:
            shown = ", ".join(outputs) or "none, the value is a scalar"
            raise DerivativeError(f"{what}: batch index '{name}' is not an index of the output "
                                  f"(its indices: {shown})")
    axes: dict[str | None, dict[str, int]] = {value: {name: outputs.index(name) for name in names}}
    # every read of a tensor: (statement position, the batch axes it is read with)
    reads: dict[str, list[tuple[int, dict[str, int]]]] = {}
    batch_locals: set[str] = set()  # the names the batch indices have in the statements
    dead: set[int] = set()
    for position in range(last, -1, -1):
        statement = statements[position]
        if not isinstance(statement, ir.Assign):
            continue
        target = statement.target if position != last else value
        if position != last and target not in reads:
            dead.add(position)  # a statement the value does not read mixes nothing: the per-sample program drops it
            continue
        if position != last:
            own = _consistent(target, reads.get(target or "", []), what)  # type: ignore[arg-type]
            axes[target] = own
        own = axes[target]
        local = {(_output_indices(statement))[axis]: name for name, axis in own.items()}
        batch_locals.update(local)
        for node in ir.walk(statement.expr):
            _check_node(node, local, position, what)
            if isinstance(node, (ir.Tensor, ir.Read)):
                positions = node.indices if isinstance(node, ir.Tensor) else node.positions
                found: dict[str, int] = {}
                for axis, index in enumerate(positions):
                    if isinstance(index, str) and index in local:
                        if local[index] in found:
                            raise DerivativeError(f"{what}: statement {position + 1} reads '{node.name}' with batch "
                                                  f"index '{local[index]}' on two axes; it mixes samples")
                        found[local[index]] = axis
                reads.setdefault(node.name, []).append((position, found))
    for x in wrt:
        carried = _consistent(x, reads.get(x, []), what)
        for name in names:
            if name not in carried:
                raise DerivativeError(f"{what}: batch index '{name}' does not follow an axis of '{x}' through the "
                                      f"program (each batch index must index one axis of every wrt input)")
        axes[x] = carried
    for tensor, seen in reads.items():
        if tensor not in axes:
            axes[tensor] = _consistent(tensor, seen, what)
    for statement in statements:  # a declared matrix ties its two axes: A[b,j] is A[j,b], so rows are no samples
        if isinstance(statement, ir.MatrixDecl):
            for tensor in statement.names:
                if axes.get(tensor):
                    name = next(iter(axes[tensor]))
                    raise DerivativeError(f"{what}: '{tensor}' is declared {statement.kind} and carries batch index "
                                          f"'{name}' on one axis: its axes are tied, so the samples along "
                                          f"'{name}' are not independent")
    used = all_index_names(ir.ProgramIR(tuple(s for s in statements if isinstance(s, ir.Assign))))
    for statement in statements:  # an index sized by a batch axis would lose its size per sample
        if isinstance(statement, ir.SizeDecl) and isinstance(statement.source, str):
            for name, axis in axes.get(statement.source, {}).items():
                if axis < len(statement.names) and statement.names[axis] in used - batch_locals:
                    raise DerivativeError(f"{what}: 'size {', '.join(statement.names)} = {statement.source}' sizes "
                                          f"'{statement.names[axis]}' by batch index '{name}'")
    return Batch(names, {k: v for k, v in axes.items() if k is not None and v}, dict(program.info.ranks),
                 program.info.inputs, frozenset(dead))


def _consistent(tensor: str, found: list[tuple[int, dict[str, int]]], what: str) -> dict[str, int]:
    """The batch axes ``tensor`` is read with, the same in every read, or a DerivativeError."""
    if not found:
        return {}
    first = found[0][1]
    for position, axes in found[1:]:
        if axes != first:
            missing = sorted((set(first) ^ set(axes)) or set(first))
            raise DerivativeError(
                f"{what}: the program mixes samples along batch index '{missing[0]}': '{tensor}' is read in "
                f"statement {position + 1} {'without it' if len(axes) < len(first) else 'on another axis'}")
    return dict(first)


def _check_node(node: ir.Expr, local: dict[str, str], position: int, what: str) -> None:
    """A DerivativeError when ``node`` sums, normalises, shifts or gathers along a batch index."""
    def mixed(index: str, how: str) -> DerivativeError:
        return DerivativeError(f"{what}: the program mixes samples along batch index '{local[index]}': "
                               f"statement {position + 1} {how}")

    if isinstance(node, ir.Reduce):
        for index in node.indices:
            if index in local:
                raise mixed(index, f"reduces over it ({node.kind}[{','.join(node.indices)}])")
    elif isinstance(node, (ir.Normalize, ir.Linalg)):
        for index in node.indices:
            if index in local:
                raise mixed(index, f"takes {node.kind}[{','.join(node.indices)}] along it")
    elif isinstance(node, ir.Delta):
        for index in (node.first, node.second):
            if index in local:
                raise mixed(index, "pairs it with another index in a delta")
    elif isinstance(node, (ir.Read, ir.ShiftDelta)):
        positions = node.positions if isinstance(node, ir.Read) else (node.position,)
        for place in positions:
            if isinstance(place, str):
                continue
            for index in place.indices:
                if index in local:
                    how = "gathers along it" if isinstance(place, ir.Gather) else "reads shifted along it"
                    raise mixed(index, f"{how} ({ir.format_position(place)})")


def summed_batch(program: Checked, wrt: list[str]) -> tuple[Checked, Batch] | None:
    """A program whose value is ``L = sum[b](...)`` over indices that index independent samples, as the
    per-sample program ``L[b] = ...`` and its batch; None when its value is not such a sum."""
    statements = program.ir.statements
    last = _last(program.ir)
    final = statements[last]
    assert isinstance(final, ir.Assign)
    expr, scale = final.expr, None
    if isinstance(expr, ir.Product) and len(expr.factors) == 2 and isinstance(expr.factors[0], ir.Num):
        scale, expr = expr.factors[0], expr.factors[1]
    if not isinstance(expr, ir.Reduce) or expr.kind != "sum" or _output_indices(final):
        return None
    for count in range(len(expr.indices), 0, -1):
        # the longest run of leading summed indices that are batch indices
        names = expr.indices[:count]
        rest = expr.indices[count:]
        body = ir.Reduce(rest, expr.body) if rest else expr.body
        if scale is not None:
            body = ir.product(scale, body)
        if set(names) - set(free_indices(body)):
            continue
        target = final.target or "f"
        if final.target is None and target in program.info.inputs + tuple(program.info.targets):
            return None
        per_sample = ir.Assign(target, names, body)
        source = checked(ir.ProgramIR((*statements[:last], per_sample, *statements[last + 1:])))
        try:
            return source, follow(source, names, wrt, "")
        except DerivativeError:
            continue
    return None


def strip(program: Checked, batch: Batch) -> Checked:
    """The per-sample program: every batch axis taken out of every tensor and statement that carries it."""
    local_names: set[str] = set()
    body: list[ir.Statement] = []
    last = _last(program.ir)
    for position, statement in enumerate(program.ir.statements):
        if position in batch.dead:
            continue
        if isinstance(statement, ir.Assign):
            target = statement.target
            own = batch.of(target) if target is not None else (
                {n: _output_indices(statement).index(n) for n in batch.names} if position == last else {})
            indices = statement.indices
            if own and indices is not None:
                local_names |= {indices[a] for a in own.values()}
                indices = tuple(i for a, i in enumerate(indices) if a not in own.values())
            body.append(ir.Assign(statement.target, indices, _strip_expr(statement.expr, batch)))
        elif isinstance(statement, ir.SizeDecl) and isinstance(statement.source, str) and batch.of(statement.source):
            drop = set(batch.of(statement.source).values())
            names = tuple(n for a, n in enumerate(statement.names) if a not in drop)
            if names:
                body.append(ir.SizeDecl(names, statement.source))
        else:
            body.append(statement)
    kept = [s for s in body if not (isinstance(s, ir.SizeDecl) and isinstance(s.source, int)
                                    and set(s.names) <= local_names)]
    read = {n.name for s in kept if isinstance(s, ir.Assign) for n in ir.walk(s.expr)
            if isinstance(n, (ir.Tensor, ir.Read))} | {s.target for s in kept if isinstance(s, ir.Assign)}
    kept = [ir.MatrixDecl(s.kind, tuple(n for n in s.names if n in read)) if isinstance(s, ir.MatrixDecl) else s
            for s in kept if not isinstance(s, ir.MatrixDecl) or set(s.names) & read]
    return checked(ir.ProgramIR(tuple(kept)))


def _strip_expr(expr: ir.Expr, batch: Batch) -> ir.Expr:
    if isinstance(expr, ir.Tensor) and batch.of(expr.name):
        drop = set(batch.of(expr.name).values())
        return ir.Tensor(expr.name, tuple(i for a, i in enumerate(expr.indices) if a not in drop))
    if isinstance(expr, ir.Read) and batch.of(expr.name):
        drop = set(batch.of(expr.name).values())
        positions = tuple(p for a, p in enumerate(expr.positions) if a not in drop)
        if all(isinstance(p, str) for p in positions):
            return ir.Tensor(expr.name, positions)  # type: ignore[arg-type]
        return ir.Read(expr.name, positions, expr.mode)
    children = ir.children(expr)
    if not children:
        return expr
    return ir.with_children(expr, tuple(_strip_expr(child, batch) for child in children))


def restore(derived: Checked, batch: Batch, outputs_first: bool = True) -> Checked:
    """The per-sample derivative program with the batch axes put back: the source program's tensors get theirs
    where they were, every new tensor that reads a batched one carries the batch indices first, and every
    output carries all of them (a per-sample result: each batch index once)."""
    taken = all_index_names(derived.ir)
    chosen: dict[str, str] = {}
    for name in batch.names:
        pick, k = name, 1
        while pick in taken or pick in chosen.values():
            pick, k = f"{name}{k}", k + 1
        chosen[name] = pick
    axes = {k: dict(v) for k, v in batch.axes.items()}
    outputs = set(derived.info.outputs) - {None}
    last = _last(derived.ir)
    fresh = _FreshIndex(taken | set(chosen.values()))
    body: list[ir.Statement] = []
    needs_size: list[str] = []
    for position, statement in enumerate(derived.ir.statements):
        if isinstance(statement, ir.SizeDecl) and isinstance(statement.source, str) and statement.source in axes:
            names = list(statement.names)
            for axis in sorted(axes[statement.source].values()):
                names.insert(axis, fresh.pick())
            body.append(ir.SizeDecl(tuple(names), statement.source))
            continue
        if not isinstance(statement, ir.Assign):
            body.append(statement)
            continue
        expr = _restore_expr(statement.expr, axes, chosen)
        carried = {name for node in ir.walk(expr) if isinstance(node, (ir.Tensor, ir.Read))
                   for name in axes.get(node.name, {})}
        target = statement.target
        if target in axes:  # a tensor of the source program: its batch axes where they were
            own = axes[target]
        else:
            is_output = target in outputs or (target is None and position == last)
            wanted = list(batch.names) if is_output else [n for n in batch.names if n in carried]
            own = {name: k for k, name in enumerate(wanted)}
            if target is not None:
                axes[target] = own
        missing = [name for name in own if name not in carried]
        needs_size.extend(n for n in missing if n not in needs_size)
        if missing:  # a per-sample constant: delta[b,b] (= 1) gives it the batch axis (sized below)
            expr = ir.product(expr, *(ir.Delta(chosen[n], chosen[n]) for n in missing))
        indices = list(statement.indices if statement.indices is not None else
                       free_indices(statement.expr) if own else ())
        for name, axis in sorted(own.items(), key=lambda item: item[1]):
            indices.insert(axis, chosen[name])
        body.append(ir.Assign(target, tuple(indices) if statement.indices is not None or own else None, expr))
    if needs_size:
        body = _sized(body, batch, chosen, needs_size, fresh)
    return checked(ir.ProgramIR(tuple(body)))


def _sized(body: list[ir.Statement], batch: Batch, chosen: dict[str, str], names: list[str],
           fresh: _FreshIndex) -> list[ir.Statement]:
    """``body`` with a size declaration of the batch indices in ``names`` first, read from a batched input."""
    for tensor, axes in sorted(batch.axes.items(), key=lambda item: item[0] not in batch.inputs):
        if set(names) <= set(axes) and tensor in batch.ranks:
            rank = batch.ranks[tensor]
            declared = [fresh.pick() for _ in range(rank)]
            for name, axis in axes.items():
                if name in names:
                    declared[axis] = chosen[name]
            return [ir.SizeDecl(tuple(declared), tensor), *body]
    raise DerivativeError(f"no input carries batch indices {', '.join(names)} to size them")  # pragma: no cover


class _FreshIndex:
    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)
        self.count = 0

    def pick(self) -> str:
        while True:
            self.count += 1
            name = f"z{self.count}"
            if name not in self.taken:
                self.taken.add(name)
                return name


def _restore_expr(expr: ir.Expr, axes: dict[str, dict[str, int]], chosen: dict[str, str]) -> ir.Expr:
    if isinstance(expr, (ir.Tensor, ir.Read)) and axes.get(expr.name):
        positions: list[ir.Position] = list(expr.indices if isinstance(expr, ir.Tensor) else expr.positions)
        for name, axis in sorted(axes[expr.name].items(), key=lambda item: item[1]):
            positions.insert(axis, chosen[name])
        if isinstance(expr, ir.Tensor):
            return ir.Tensor(expr.name, tuple(positions))  # type: ignore[arg-type]
        return ir.Read(expr.name, tuple(positions), expr.mode)
    children = ir.children(expr)
    if not children:
        return expr
    return ir.with_children(expr, tuple(_restore_expr(child, axes, chosen) for child in children))

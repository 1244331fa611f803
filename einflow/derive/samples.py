"""Per-sample derivatives made whole: the output's sample indices, and a per-sample result expanded back over them."""

from __future__ import annotations

from einflow.derive.batch import Batch, follow
from einflow.derive.normal import all_index_names
from einflow.lang import ir
from einflow.lang.check import Checked, checked
from einflow.lang.errors import DerivativeError
from einflow.lang.indices import free_indices

__all__ = ["value_name", "value_indices", "last_assign", "sample_indices", "expanded", "with_name"]


def value_name(program: Checked) -> str | None:
    return program.ir.statements[last_assign(program.ir)].target  # type: ignore[union-attr]


def value_indices(program: Checked) -> tuple[str, ...]:
    statement = program.ir.statements[last_assign(program.ir)]
    assert isinstance(statement, ir.Assign)
    return statement.indices if statement.indices is not None else free_indices(statement.expr)


def last_assign(program: ir.ProgramIR) -> int:
    return max(k for k, s in enumerate(program.statements) if isinstance(s, ir.Assign))


def sample_indices(program: Checked, wrt: list[str]) -> Batch | None:
    """The output's indices that index independent samples of every ``wrt`` input (None if there are none)."""
    names = []
    for index in value_indices(program):
        try:
            follow(program, (index,), wrt, "")
        except DerivativeError:
            continue
        names.append(index)
    if not names:
        return None
    try:
        return follow(program, tuple(names), wrt, "")
    except DerivativeError:  # pragma: no cover - each follows alone, so all do together
        return None


def expanded(per: Checked, names: tuple[str, ...], groups: list[tuple[int, dict[str, int]]]) -> Checked:
    """A per-sample derivative ``D[b..., rest of group 1..., rest of group 2...]`` as the whole derivative: each
    group of axes (rank, batch axes) in order, the batch axes of later groups tied to the first's by deltas (a
    block-diagonal result); no group: the sum over the samples. The per-sample statement is written into the
    result's (no statement holds a per-sample copy)."""
    statements = list(per.ir.statements)
    last = last_assign(per.ir)
    final = statements[last]
    assert isinstance(final, ir.Assign) and final.target is not None and final.indices is not None
    if len(groups) == 1 and all(groups[0][1].get(n) == k for k, n in enumerate(names)):
        return per  # already in the wrt's own axis order
    taken = all_index_names(per.ir) | set(per.info.inputs) | set(per.info.targets)
    pool = iter([*"pqrsuvwacdeg"] + [f"{c}{n}" for n in range(2, 10) for c in "pqrsuvw"])

    def pick() -> str:
        name = next(pool)
        while name in taken:
            name = next(pool)
        taken.add(name)
        return name

    batch = {name: final.indices[k] for k, name in enumerate(names)}
    rest = list(final.indices[len(names):])
    target: list[str] = []
    deltas: list[ir.Expr] = []
    for position, (rank, axes) in enumerate(groups):
        inverse = {axis: name for name, axis in axes.items()}
        for axis in range(rank):
            if axis not in inverse:
                target.append(rest.pop(0))
            elif position == 0:
                target.append(batch[inverse[axis]])
            else:
                partner = pick()
                deltas.append(ir.Delta(batch[inverse[axis]], partner))
                target.append(partner)
    # (a per-sample constant carries delta[b,b] markers: the deltas or the sum give the batch axes instead)
    expr = _without_markers(final.expr, set(batch.values())) if groups and len(groups) > 1 else final.expr
    if groups:
        factors = list(expr.factors) if isinstance(expr, ir.Product) else [expr]
        scale = factors[:1] if isinstance(factors[0], ir.Num) else []
        new = ir.Assign(final.target, tuple(target), ir.product(*scale, *deltas, *factors[len(scale):]))
    else:
        new = ir.Assign(final.target, (), ir.Reduce(tuple(batch.values()), expr))
    statements[last] = new
    return checked(ir.ProgramIR(tuple(statements)))


def _without_markers(expr: ir.Expr, indices: set[str]) -> ir.Expr:
    """``expr`` without its ``delta[b,b]`` factors on ``indices`` (where a delta to a partner gives b instead)."""
    if isinstance(expr, ir.Product):
        kept = [f for f in expr.factors if not (isinstance(f, ir.Delta) and f.first == f.second
                                                 and f.first in indices)]
        return ir.product(*kept) if kept else ir.Num(1)
    return expr


def with_name(program: Checked, name: str) -> Checked:
    """``program`` with its output (the last statement's target, read by no other) renamed to ``name``."""
    statements = list(program.ir.statements)
    last = last_assign(program.ir)
    final = statements[last]
    assert isinstance(final, ir.Assign)
    if name in program.info.inputs or name in program.info.targets:
        return program
    statements[last] = ir.Assign(name, final.indices, final.expr)
    return checked(ir.ProgramIR(tuple(statements)))

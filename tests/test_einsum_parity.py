"""numpy.einsum parity: each subscripts string through einflow.einsum and through the DSL, vs numpy.einsum."""

from __future__ import annotations

import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import einflow as ef

#: numpy subscripts, each checked through einflow.einsum and through an equivalent einflow statement
EQUATIONS = [
    # scalars and 0-d operands
    "", "->", ",->", ",", "i,->i", ",i->i", "i,", "ij,->ji",
    # vectors: sums, Hadamard, dot, outer
    "i", "i->", "i->i", "i,i", "i,i->i", "i,i->", "i,j", "i,j->ij", "i,j->ji", "i,i,i", "i,i,i->i", "a,b,c->abc",
    # matrices: transposes, traces, diagonals, reductions
    "ij", "ji", "ij->ji", "ij->", "ij->i", "ij->j", "ii", "ii->i", "ii->", "ijk->kji", "ijk->jik", "kji", "iij",
    "iij->ij", "ijj->i", "iii->i", "iii", "ijij->ij", "ijji", "AB->BA", "Ab,bC->CA",
    # matrix products and batches
    "ij,jk", "ij,jk->ik", "ij,jk->ki", "ik,kj", "ji,jk", "ij,kj->ik", "bij,bjk->bik", "bij,bjk->bki", "bij,bjk",
    "ij,ij", "ij,ij->ij", "ij,ij->", "ij,ji->", "ij,ji->ij", "ij,j", "ij,j->i", "ij,i->i", "ii,i->i", "ij,jj->ij",
    "ba,ab->a", "ab,ab,ab->", "ab,bc,cd->ad", "ab,bc,cd,de->ae", "abc,cd,de->abe", "ab,cd->abcd", "ab,cd->dcba",
    "ij,jk,kl,li->", "ijk,jkl->il", "i,ij,j->", "bn,bm,nm->b", "ab,b,bc->ac", "ab,ac,ad->bcd",
    # ellipsis
    "...", "i...->...i", "...i->...", "i...->...", "...ij,...jk->...ik", "...ii->...i", "ij...,jk...->ik...",
    "...i,...i", "...i,...i->...", "i...,i...->...", "...ij->...ji", "a...a->...a", "...,...->...", "...i,i->...",
    # whitespace is ignored
    " ij , jk -> ik ",
    # ---- cases that previously failed (only ever grows)
]

_LETTER_SIZES = {letter: 2 + position % 3 for position, letter in enumerate(string.ascii_letters)}
_ELLIPSIS_SHAPE = (2, 3)


def _split(subscripts: str) -> tuple[list[str], str | None]:
    spec = subscripts.replace(" ", "")
    if "->" in spec:
        inputs, output = spec.split("->")
        return inputs.split(","), output
    return spec.split(","), None


def _shape(term: str, ellipsis: tuple[int, ...]) -> tuple[int, ...]:
    head, _, tail = term.partition("...")
    if "..." not in term:
        return tuple(_LETTER_SIZES[c] for c in term)
    return tuple(_LETTER_SIZES[c] for c in head) + ellipsis + tuple(_LETTER_SIZES[c] for c in tail)


def operands_for(subscripts: str, rng: np.random.Generator, ellipsis: tuple[int, ...] = _ELLIPSIS_SHAPE
                 ) -> list[np.ndarray]:
    terms, _ = _split(subscripts)
    return [rng.normal(size=_shape(term, ellipsis)) for term in terms]


def to_statement(subscripts: str, shapes: list[tuple[int, ...]]) -> str:
    """An einflow statement computing ``numpy.einsum(subscripts, ...)`` on tensors X0, X1, ...

    Ellipsis axes become indices E0, E1, ... aligned from the right like numpy's broadcasting. numpy's implicit
    output is the once-occurring letters sorted (ellipsis axes first); the statement names it as an explicit
    target, since einflow's implicit targets use order of first occurrence instead.
    """
    terms, output = _split(subscripts)
    ellipsis_ranks = [len(shape) - len(term.replace("...", "")) for term, shape in zip(terms, shapes)]
    width = max([rank for term, rank in zip(terms, ellipsis_ranks) if "..." in term], default=0)
    broadcast = [f"E{k}" for k in range(width)]

    def indices(term: str, rank: int) -> list[str]:
        head, _, tail = term.partition("...")
        middle = broadcast[width - rank:] if "..." in term else []
        return list(head) + middle + list(tail)

    operand_indices = [indices(term, rank) for term, rank in zip(terms, ellipsis_ranks)]
    if output is None:
        counts: dict[str, int] = {}
        for letters in operand_indices:
            for index in letters:
                counts[index] = counts.get(index, 0) + 1
        used = [e for e in broadcast if e in counts]
        target = used + sorted(i for i, n in counts.items() if n == 1 and not i.startswith("E"))
    else:
        head, _, tail = output.partition("...")
        target = list(head) + (broadcast if "..." in output else []) + list(tail)
    factors = [f"X{n}[{','.join(letters)}]" if letters else f"X{n}" for n, letters in enumerate(operand_indices)]
    body = " ".join(factors)
    if target:
        return f"T[{','.join(target)}] = {body}"
    everything = list(dict.fromkeys(index for letters in operand_indices for index in letters))
    return f"T = sum[{','.join(everything)}]({body})" if everything else f"T = {body}"


def check(subscripts: str, operands: list[np.ndarray], through_dsl: bool = True) -> None:
    want = np.einsum(subscripts, *operands)
    got = ef.einsum(subscripts, *operands)
    assert type(got) is type(want), subscripts  # a numpy scalar for a full contraction, like numpy
    assert np.shape(got) == want.shape, subscripts
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=subscripts)
    if through_dsl:
        statement = to_statement(subscripts, [op.shape for op in operands])
        value = ef.evaluate(statement, {f"X{n}": op for n, op in enumerate(operands)})
        assert np.shape(value) == want.shape, statement
        np.testing.assert_allclose(value, want, rtol=1e-10, atol=1e-12, err_msg=statement)


def test_converter_examples() -> None:
    assert to_statement("ij,jk->ik", [(2, 3), (3, 4)]) == "T[i,k] = X0[i,j] X1[j,k]"
    assert to_statement("ji", [(3, 2)]) == "T[i,j] = X0[j,i]"
    assert to_statement("ii", [(3, 3)]) == "T = sum[i](X0[i,i])"
    assert to_statement("...ij->...ji", [(5, 2, 3)]) == "T[E0,j,i] = X0[E0,i,j]"


@pytest.mark.parametrize("subscripts", EQUATIONS)
def test_parity(subscripts: str) -> None:
    rng = np.random.default_rng(abs(hash(subscripts)) % 2**32)
    check(subscripts, operands_for(subscripts, rng))


@pytest.mark.parametrize(("subscripts", "shapes"), [
    ("...ij,...jk->...ik", [(1, 2, 3), (4, 3, 2)]),
    ("...i,...i->...", [(5, 1, 3), (4, 3)]),
    ("ij,jk", [(2, 1), (4, 2)]),
    ("...,...->...", [(3, 1), (1, 4)]),
])
def test_parity_with_size_one_broadcasting(subscripts: str, shapes: list[tuple[int, ...]]) -> None:
    # numpy broadcasts length-1 axes; the DSL does not (an index has one size), so only einsum is checked
    rng = np.random.default_rng(1)
    check(subscripts, [rng.normal(size=shape) for shape in shapes], through_dsl=False)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.complex128])
def test_parity_keeps_numpy_dtypes(dtype: type) -> None:
    a = (np.arange(6).reshape(2, 3) + 1).astype(dtype)
    b = (np.arange(12).reshape(3, 4) - 2).astype(dtype)
    got = ef.einsum("ij,jk->ik", a, b)
    want = np.einsum("ij,jk->ik", a, b)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want)


def test_einsum_accepts_lists() -> None:
    np.testing.assert_allclose(ef.einsum("ij->ji", [[1.0, 2.0], [3.0, 4.0]]), [[1.0, 3.0], [2.0, 4.0]])


@pytest.mark.parametrize(("subscripts", "shapes"), [
    ("ij,jk", [(2, 3), (4, 2)]), ("ij", [(2,)]), ("ij,jk", [(2, 3)]), ("i$", [(2, 2)]), ("i->j", [(2,)]),
    ("i->ii", [(2,)]), ("ij-", [(2, 2)]), ("i1", [(2, 2)]), ("iα", [(2, 2)]), ("i.j", [(2, 2)]),
    ("...i...", [(2, 2)]), ("i,j", [(2,), (2,), (2,)]),
])
def test_invalid_subscripts_raise_einflow_errors(subscripts: str, shapes: list[tuple[int, ...]]) -> None:
    with pytest.raises(ValueError):
        np.einsum(subscripts, *[np.ones(shape) for shape in shapes])
    with pytest.raises(ef.EinflowError):
        ef.einsum(subscripts, *[np.ones(shape) for shape in shapes])


def test_size_mismatch_is_a_shape_error_naming_the_index() -> None:
    with pytest.raises(ef.ShapeError, match="index 'j' has size 3 in operand 0 but size 4 in operand 1"):
        ef.einsum("ij,jk", np.ones((2, 3)), np.ones((4, 2)))


# ---------------------------------------------------------------- property: random subscripts

_ALPHABET = "abcd"


@st.composite
def random_subscripts(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    count = draw(st.integers(1, 3))
    terms = [draw(st.text(_ALPHABET, min_size=0, max_size=3)) for _ in range(count)]
    used = sorted(set("".join(terms)))
    sizes = {letter: draw(st.integers(1, 3)) for letter in used}
    if draw(st.booleans()):
        output = draw(st.permutations(used))
        output = output[: draw(st.integers(0, len(output)))]
        return ",".join(terms) + "->" + "".join(output), sizes
    return ",".join(terms), sizes


@settings(max_examples=60, deadline=None)
@given(case=random_subscripts(), seed=st.integers(0, 2**16))
def test_random_subscripts_match_numpy(case: tuple[str, dict[str, int]], seed: int) -> None:
    subscripts, sizes = case
    rng = np.random.default_rng(seed)
    terms, _ = _split(subscripts)
    operands = [rng.normal(size=tuple(sizes[c] for c in term)) for term in terms]
    check(subscripts, operands)

"""Fuzzing: random token soup and mutated programs may fail, but only ever with an EinflowError."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import pytest

import einflow as ef
from einflow.lang import ir

_TOKENS = (
    # names: tensors, indices, and words that are reserved
    "x", "y", "A", "B", "s", "W_1", "i", "j", "k", "batch", *ir.FUNCTIONS, "sum", "delta", "size",
    # numbers, including awkward ones
    "0", "1", "2", "2.", "0.5", ".5", "1e-3", "2.5E+4", "1e999", "99999999999999999999", "1.5.3",
    # punctuation and operators
    "+", "-", "*", "/", "^", "**", "=", ",", ";", "(", ")", "[", "]", "#", "\n", " ", "  ", "\t",
    # characters that are not in the language
    "@", "$", "é", "\r", "'", ".", "!", "{", "}", "\\",
    # line breaks Python knows but the language does not, control characters
    "\f", "\v", "\x1c", "\u2028", "\u2029", "\x85", "\x00", "\x1b", "\u200b", "\ufeff",
    # names Python would fold (NFKC) into ASCII ones, and combining marks
    "ｘ", "ﬁ", "ℌ", "x\u0301", "Ａ", "ｓｕｍ",
    # literals beyond int64, beyond float range, beyond what Python reads into an int
    "9223372036854775808", "9" * 400, "9" * 4301, "0" * 5000 + "1", "1" * 4400 + ".5",
)
_SEEDS = [
    "C[i,j] = A[i,k] B[k,j]",
    "f = x[i] x[i]",
    "y[i] = A[i,j] x[i] + s",
    "sum[i](log(1 + exp(-y[i] A[i,j] x[j])))",
    "size p, q = A\nT[p,q] = delta[p,q] + A[p,q]",
    "h[b,k] = tanh(B[b,f] A[f,k])\nL = h[b,k] h[b,k]",
    "a = x[i] x[i]\nb[i] = a x[i]\na, b",
    "t = -x[i]^2 / (1 + y[i]^-0.5) + sigmoid(s) relu(x[i]) step(y[i])",
    "y[i] = 2 (A[i,j] + x[i]); z = y[i] y[i]",
    "T[i,j] = delta[i,j] x[j] - sqrt(abs(A[i,j]))",
]


def _random_tokens(generator: random.Random) -> str:
    return "".join(generator.choice(_TOKENS) + generator.choice(("", " ")) for _ in range(generator.randint(1, 14)))


def _mutate(text: str, generator: random.Random) -> str:
    for _ in range(generator.randint(1, 3)):
        if not text:
            return generator.choice(_TOKENS)
        position = generator.randrange(len(text))
        action = generator.randrange(5)
        if action == 0:  # delete a character
            text = text[:position] + text[position + 1:]
        elif action == 1:  # insert a token
            text = text[:position] + generator.choice(_TOKENS) + text[position:]
        elif action == 2:  # replace a character with a token
            text = text[:position] + generator.choice(_TOKENS) + text[position + 1:]
        elif action == 3:  # swap two characters
            other = generator.randrange(len(text))
            chars = list(text)
            chars[position], chars[other] = chars[other], chars[position]
            text = "".join(chars)
        else:  # duplicate a slice
            end = min(len(text), position + generator.randint(1, 8))
            text = text[:end] + text[position:end] + text[end:]
    return text


def _arrays_for(program: ef.Program, generator: random.Random) -> dict[str, Any]:
    """Arrays for the program's inputs: usually the right rank, sometimes not; odd sizes and dtypes; numbers."""
    arrays: dict[str, Any] = {}
    rng = np.random.default_rng(generator.randrange(2**32))
    for name in program.inputs:
        rank = program.info.ranks.get(name, 0)
        if generator.random() < 0.1:
            rank = max(0, rank + generator.choice((-1, 1)))
        shape = tuple(generator.choice((2, 3, 3, 1, 0)) for _ in range(rank))
        if not shape and generator.random() < 0.3:
            arrays[name] = generator.choice((2, 0.5, 0, -1.5, True))
        elif generator.random() < 0.05:
            arrays[name] = rng.normal(size=shape).tolist()
        else:
            dtype = generator.choice((np.float64, np.float64, np.float32, np.int64, np.int32, np.bool_, np.complex128,
                                      np.float16, np.uint8))
            arrays[name] = (rng.normal(size=shape) * 3).astype(dtype)
    return arrays


def _run(text: str, generator: random.Random) -> str:
    """Compile and evaluate ``text``; return what happened. Anything but an EinflowError propagates."""
    try:
        program = ef.compile(text)
    except ef.EinflowError:
        return "rejected"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflow and invalid values are numpy's business, not errors
        for _ in range(2):
            try:
                program(_arrays_for(program, generator))
            except ef.EinflowError:
                continue
            str(program)
            return "evaluated"
    return "compiled"


def _fuzz(make_text: Any, count: int, seed: int) -> dict[str, int]:
    generator = random.Random(seed)
    outcomes = {"rejected": 0, "compiled": 0, "evaluated": 0}
    for _ in range(count):
        text = make_text(generator)
        try:
            outcomes[_run(text, generator)] += 1
        except ef.EinflowError:  # pragma: no cover - _run handles these
            raise
        except Exception as error:
            pytest.fail(f"{type(error).__name__} escaped for {text!r}: {error}")
    return outcomes


def test_random_token_strings_raise_only_einflow_errors() -> None:
    outcomes = _fuzz(_random_tokens, 6000, seed=1)
    assert outcomes["rejected"] > 3000  # most soup is not a program
    assert outcomes["evaluated"] > 20  # but some is, and runs


def test_mutated_programs_raise_only_einflow_errors() -> None:
    outcomes = _fuzz(lambda generator: _mutate(generator.choice(_SEEDS), generator), 5000, seed=2)
    assert outcomes["evaluated"] > 200 and outcomes["rejected"] > 1000  # hostile tokens reject more


def test_random_expressions_raise_only_einflow_errors(make_expression: Any) -> None:
    outcomes = _fuzz(lambda generator: make_expression(generator, 4), 800, seed=3)
    assert outcomes["evaluated"] > 300


def test_hostile_inputs_raise_only_einflow_errors() -> None:
    """Huge literals and sizes, control characters, NFKC-folding names dropped into working programs."""
    hostile = ("9" * 4301, "9" * 400, str(2**63), "\f", "\u2028", "\r", "\x00", "ｘ", "ﬁ", "x\u0301")

    def make(generator: random.Random) -> str:
        text = generator.choice(_SEEDS + ["size n = 3\nI[n,m] = delta[n,m]", "y = 2 x[i] + 1"])
        for _ in range(generator.randint(1, 2)):
            position = generator.randrange(len(text) + 1)
            text = text[:position] + generator.choice(hostile) + text[position:]
        return text

    outcomes = _fuzz(make, 400, seed=4)
    assert outcomes["rejected"] > 100 and outcomes["evaluated"] > 20


@pytest.mark.parametrize("count", [20, 51, 52, 53, 70])
def test_wide_products_raise_only_einflow_errors(count: int) -> None:
    """Products with many distinct indices, in a shuffled order: numpy's 52 letters are no limit."""
    generator = random.Random(count)
    indices = [f"i{k}" for k in range(count)]
    generator.shuffle(indices)
    factors = [f"M{k}[{indices[k]},{indices[k + 1]}]" for k in range(count - 1)]
    text = "y = " + " ".join(factors)
    matrices = {f"M{k}": np.full((2, 2), 0.5) for k in range(count - 1)}
    # (0.5 J)^n = 0.5 J for the 2x2 matrix of ones J; the free ends are the first and last index
    np.testing.assert_allclose(ef.compile(text)(matrices), np.full((2, 2), 0.5))


def test_error_messages_point_at_the_line_the_parser_counted() -> None:
    """After any mix of line-break characters, a ParseError's line is the text's n-th line split at \\n."""
    generator = random.Random(5)
    breaks = ("\n", "\r\n", "\f", "\r", "\u2028", "\v", "\x85", "\x1e")
    for _ in range(300):
        text = "".join(generator.choice(("a = x", "b = $", "c = y", "d = (", generator.choice(breaks)))
                       for _ in range(generator.randint(2, 8)))
        try:
            ef.compile(text)
        except ef.ParseError as error:
            assert "'?'" not in str(error), repr(text)
            lines = text.split("\n")
            assert 1 <= error.line <= len(lines), repr(text)
            shown = "".join(" " if not c.isprintable() or c.isspace() and c not in " \t" else c
                            for c in lines[error.line - 1])
            assert error.source_line.rstrip() == shown.rstrip(), repr(text)
        except ef.EinflowError:
            pass


@pytest.mark.parametrize("depth", [50, 150, 400, 3000])
@pytest.mark.parametrize("shape", ["({})", "exp({})", "sum[i]({} x[i])", "-{}", "(x + {})"])
def test_deep_nesting_raises_only_einflow_errors(shape: str, depth: int) -> None:
    text = "x[i]" if "sum" in shape else "x"
    for _ in range(depth):
        text = shape.format(text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = ef.evaluate("y = " + text, x=np.full(2, 0.1) if "[i]" in text else 0.1)
    except ef.ParseError as error:
        assert depth > 100 and "nested too deeply" in str(error)
    except ef.IndexRuleError:
        assert "sum" in shape  # sum[i](... sum[i](...)) sums a bound index
    else:
        assert np.all(np.isfinite(value)) or "exp" in shape

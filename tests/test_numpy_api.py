"""einflow.einsum and einsum_path as numpy drop-ins: options, dtypes, errors, the memory guard."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef

RNG = np.random.default_rng(7)


# ---------------------------------------------------------------------------------------------- dtypes
def test_mixed_dtypes_compute_in_numpys_result_dtype():
    flags = np.ones(3, bool)
    small = np.full(100, 2, np.int8)
    cases = [
        ("i,i,->", flags, flags, 1.0),
        ("i,i,->", small, small, 1.0),
        ("i,i,i", np.ones(3, np.int16), np.ones(3, np.uint16), np.ones(3, np.float32)),
        ("ij,jk,k->i", np.full((3, 4), 100, np.int8), np.full((4, 5), 3, np.int16), np.ones(5, np.float32)),
        ("i,i,i->", np.arange(4, dtype=np.uint8) + 200, np.ones(4, np.uint8), np.ones(4, np.int64)),
    ]
    for subscripts, *operands in cases:
        # numpy's single-pass einsum (optimize=False) is the reference: its optimized paths contract pairs in
        # their own dtype (bool, int8), the inconsistency einflow does not copy
        expected = np.einsum(subscripts, *operands, optimize=False)
        for optimize in ("auto", "greedy", True, False, "optimal"):
            got = ef.einsum(subscripts, *operands, optimize=optimize)
            assert np.asarray(got).dtype == np.asarray(expected).dtype, (subscripts, optimize)
            np.testing.assert_array_equal(got, expected)
    assert float(ef.einsum("i,i,->", flags, flags, 1.0)) == 3.0
    assert float(ef.einsum("i,i,->", small, small, 1.0)) == 400.0
    assert ef.einsum("i,i,i", np.ones(3, np.int16), np.ones(3, np.uint16), np.ones(3, np.float32)).dtype == np.float32


def test_dtype_and_casting_options():
    a = np.arange(6.0).reshape(2, 3)
    b = np.arange(3, dtype=np.int32)
    with pytest.raises(TypeError):
        np.einsum("ij,j->i", a, b, dtype=np.float32)  # float64 -> float32 is not 'safe'
    with pytest.raises(ef.ArgumentError, match="casting"):
        ef.einsum("ij,j->i", a, b, dtype=np.float32)
    got = ef.einsum("ij,j->i", a, b, dtype=np.float32, casting="same_kind")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.einsum("ij,j->i", a, b, dtype=np.float32, casting="same_kind"))
    assert ef.einsum("ij,j->i", a.astype(np.float32), b.astype(np.int8), dtype=np.float64).dtype == np.float64
    with pytest.raises(TypeError):
        np.einsum("ij,j->i", a, b, dtype=np.int32)
    with pytest.raises(ef.ArgumentError, match="casting"):
        ef.einsum("ij,j->i", a, b, dtype=np.int32)
    got = ef.einsum("ij,j->i", a, b, dtype=np.int32, casting="unsafe")
    np.testing.assert_array_equal(got, np.einsum("ij,j->i", a, b, dtype=np.int32, casting="unsafe"))
    with pytest.raises(ef.ArgumentError):
        ef.einsum("ij,j->i", a, b, casting="no")  # int32 is not float64
    with pytest.raises(ValueError):
        ef.einsum("ij,j->i", a, b, casting="blah")
    with pytest.raises(TypeError):
        ef.einsum("ij,j->i", a, b, dtype="bad_data_type")


def test_out_is_written_and_returned():
    a, b = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 5))
    out = np.empty((3, 5))
    assert ef.einsum("ij,jk->ik", a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b)
    strided = np.zeros((3, 10))[:, ::2]
    ef.einsum("ij,jk->ik", a, b, out=strided)
    np.testing.assert_allclose(strided, a @ b)
    scalar = np.array(0.0)
    assert ef.einsum("i,i->", a[0], a[0], out=scalar) is scalar
    assert scalar == pytest.approx(a[0] @ a[0])
    with pytest.raises(ef.ShapeError):
        ef.einsum("ij,jk->ik", a, b, out=np.empty((5, 3)))
    with pytest.raises(TypeError):
        ef.einsum("ij,jk->ik", a, b, out=[[0.0] * 5] * 3)
    overlapping = np.arange(9).reshape(3, 3)
    expected = overlapping @ overlapping
    assert ef.einsum("ij,jk->ik", overlapping, overlapping, out=overlapping) is overlapping
    np.testing.assert_array_equal(overlapping, expected)


def test_order_option():
    a, b = np.ones((2, 3, 5), order="F"), np.ones((4, 3), order="F")
    assert ef.einsum("...ft,mf->...mt", a, b, order="C").flags.c_contiguous
    assert ef.einsum("...ft,mf->...mt", a, b, order="F").flags.f_contiguous
    assert ef.einsum("...ft,mf->...mt", a, b, order="A").flags.f_contiguous
    with pytest.raises(ValueError):
        ef.einsum("...ft,mf->...mt", a, b, order="W")


def test_sublist_form_matches_numpy():
    a, b, c = RNG.normal(size=(2, 3)), RNG.normal(size=(3, 4)), RNG.normal(size=(4,))
    cases = [
        (a, [0, 1], b, [1, 2], [0, 2]),
        (a, [0, 1], b, [1, 2], c, [2]),
        (a, [0, 1], b, [1, 2], c, [2], [0]),
        (RNG.normal(size=(5, 2, 2)), [Ellipsis, 0, 0], [Ellipsis, 0]),
        (a, np.array([0, 1]), b, [1, 51], [51, 0]),
    ]
    for case in cases:
        np.testing.assert_allclose(ef.einsum(*case), np.einsum(*case))
    with pytest.raises(ValueError):
        ef.einsum(a, [0, 52], b, [52, 2])
    with pytest.raises(TypeError):
        ef.einsum(a, ["i", "j"])


# ---------------------------------------------------------------------------------------------- paths
@pytest.mark.parametrize("optimize", ["greedy", "optimal", True, False, ("greedy", 0), ("optimal", 50)])
def test_einsum_path_is_numpys(optimize):
    subscripts = "ea,fb,abcd,gc,hd->efgh"
    sizes = dict(zip("abcdefgh", (2, 3, 4, 5, 4, 3, 2, 6)))
    operands = [RNG.random([sizes[c] for c in term]) for term in subscripts.split("->")[0].split(",")]
    path, report = ef.einsum_path(subscripts, *operands, optimize=optimize)
    expected, _ = np.einsum_path(subscripts, *operands, optimize=optimize)
    assert path == expected
    assert report.splitlines()[0].startswith("  Complete contraction:")
    assert report.splitlines()[-1].split("->")[-1].strip() == "efgh"
    np.testing.assert_allclose(ef.einsum(subscripts, *operands, optimize=path), np.einsum(subscripts, *operands))


def test_explicit_paths_are_checked():
    a, b, c = np.ones((2, 3)), np.ones((3, 4)), np.ones((4, 5))
    np.testing.assert_allclose(ef.einsum("ij,jk,kl->il", a, b, c, optimize=["einsum_path", (1, 2), (0, 1)]),
                               a @ b @ c)
    np.testing.assert_allclose(ef.einsum("ij,jk->ik", a, b, optimize=[(0, 1)]), a @ b)  # opt_einsum's form
    for bad in ([(0, 1)], ["einsum_path", (0, 1)], [(0, 5), (0, 1)], [(0, 0), (0, 1)], [("a", 1)]):
        with pytest.raises(ef.PathError) as caught:
            ef.einsum("ij,jk,kl->il", a, b, c, optimize=bad)
        assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, ValueError)
    with pytest.raises(ef.ArgumentError):
        ef.einsum("ij,jk->ik", a, b, optimize=3.5)
    with pytest.raises(ef.ArgumentError):
        ef.einsum("ij,jk->ik", a, b, optimize="fastest")


def test_opt_einsum_algorithms_still_work():
    a, b, c = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 5)), RNG.normal(size=(5, 2))
    import opt_einsum as oe

    for optimize in ("auto", "dp", "branch-2", oe.paths.DynamicProgramming()):
        np.testing.assert_allclose(ef.einsum("ij,jk,kl->il", a, b, c, optimize=optimize), a @ b @ c)
    path, _ = ef.einsum_path("ij,jk,kl->il", a, b, c, optimize="dp")
    assert path[0] == "einsum_path" and len(path) == 3


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("call, kind", [
    (lambda: ef.einsum("...i->i", np.ones((2, 3, 4))), ef.SubscriptsError),
    (lambda: ef.einsum("i- >i", np.ones(3)), ef.SubscriptsError),
    (lambda: ef.einsum("i-", np.ones(3)), ef.SubscriptsError),
    (lambda: ef.einsum("ii", np.ones((1, 3))), ef.ShapeError),
    (lambda: ef.einsum("ii", np.ones((1, 2))), ef.ShapeError),
    (lambda: ef.einsum(), ef.SubscriptsError),
    (lambda: ef.einsum("i"), ef.SubscriptsError),
    (lambda: ef.einsum("i,i", [1.0, 2.0], [[1.0], [2.0, 3.0]]), ef.ShapeError),
    (lambda: ef.einsum("ij,jk", np.ones((2, 3)), np.ones((4, 2))), ef.ShapeError),
    (lambda: ef.einsum("i%", np.ones((2, 2))), ef.SubscriptsError),
    (lambda: ef.einsum("i->ij", np.ones(2)), ef.SubscriptsError),
    (lambda: ef.einsum("i..", np.ones(2)), ef.SubscriptsError),
    (lambda: ef.einsum("i,j", np.ones(2)), ef.SubscriptsError),
])
def test_what_numpy_rejects_is_an_einflow_value_error(call, kind):
    with pytest.raises(kind) as caught:
        call()
    assert isinstance(caught.value, ef.EinflowError) and isinstance(caught.value, ValueError)


def test_numpy_rejects_the_same_calls():
    """The reference: numpy raises ValueError for each of the calls above that it can express."""
    for args in (("...i->i", np.ones((2, 3, 4))), ("i- >i", np.ones(3)), ("ii", np.ones((1, 3))),
                 ("ii", np.ones((1, 2))), ("i%", np.ones((2, 2))), ("i->ij", np.ones(2))):
        with pytest.raises(ValueError):
            np.einsum(*args)


def test_argument_types_are_type_errors():
    for call in (lambda: ef.einsum(0, 0), lambda: ef.einsum(*(None,) * 63), lambda: ef.einsum("i", np.ones(2), bad=1),
                 lambda: ef.einsum("i", np.ones(2), out="x")):
        with pytest.raises(ef.ArgumentError) as caught:
            call()
        assert isinstance(caught.value, TypeError)


def test_unknown_keyword_is_a_type_error_like_numpy():
    with pytest.raises(TypeError):
        np.einsum("i", np.ones(2), bad=1)
    with pytest.raises(ef.ArgumentError, match="did you mean 'optimize'"):
        ef.einsum("i", np.ones(2), optimise=True)
    with pytest.raises(ef.ArgumentError, match="'bad'"):
        ef.einsum_path("i", np.ones(2), bad=1)


def test_error_classes_keep_their_messages_and_numpy_bases():
    assert issubclass(ef.ParseError, ValueError) and issubclass(ef.IndexRuleError, ValueError)
    assert issubclass(ef.ShapeError, ValueError) and issubclass(ef.ArgumentError, TypeError)
    assert issubclass(ef.MemoryLimitError, MemoryError)
    with pytest.raises(ValueError, match="line 1, column 22"):
        ef.compile("C[i,j] = A[i,k] B[k,j")
    with pytest.raises(ValueError, match="index 'k' has size 3 in A"):
        ef.evaluate("C[i,j] = A[i,k] B[k,j]", A=np.ones((2, 3)), B=np.ones((4, 2)))


# ---------------------------------------------------------------------------------------------- guard, objects
def test_einsum_is_guarded_by_the_memory_limit():
    x = np.ones(10**6)
    with pytest.raises(ef.MemoryLimitError, match="nothing was allocated"):
        ef.einsum("i,j->ij", x, x)  # 8 TB
    with pytest.raises(MemoryError):
        ef.einsum("i,j,k->ijk", np.ones(10**4), np.ones(10**4), np.ones(10**4))


def test_object_arrays_are_handed_to_numpy():
    from fractions import Fraction

    a = np.array([Fraction(1, 3), Fraction(1, 2)], dtype=object)
    got = ef.einsum("i,i->", a, a)
    assert got == Fraction(13, 36)


def test_strings_are_refused():
    with pytest.raises(ef.ArgumentError, match="numbers"):
        ef.einsum("i,i", np.array(["a", "b"]), np.array(["c", "d"]))


def test_one_operand_returns_views_like_numpy():
    a = np.arange(9.0).reshape(3, 3)
    assert ef.einsum("ii->i", a).base is a.base or ef.einsum("ii->i", a).base is a
    assert np.shares_memory(ef.einsum("ji", a), a)


# ---------------------------------------------------------------------------------------------- DSL dtypes
@pytest.mark.parametrize("text, subscripts, names", [
    ("s = a[i] b[i] c", "i,i,->", "abc"),
    ("s = a[i] b[i] c[i]", "i,i,i->", "abc"),
    ("t[i] = a[i] b[i] c[i]", "i,i,i->i", "abc"),
    ("T[i,k] = a[i,j] b[j,k] c[k]", "ij,jk,k->ik", "abc"),
])
@pytest.mark.parametrize("dtypes", [(bool, bool, np.float64), (np.int8, np.int8, np.float64),
                                    (np.int16, np.uint16, np.float32), (np.uint8, np.int8, np.int16),
                                    (np.float32, np.int8, np.float32)])
def test_dsl_products_compute_in_numpys_result_dtype(text, subscripts, names, dtypes):
    shapes = {"i": 60, "j": 5, "k": 4}
    terms = subscripts.split("->")[0].split(",")
    arrays = {name: np.asarray(np.full([shapes[c] for c in term], 7), dtype=dtype)
              for name, term, dtype in zip(names, terms, dtypes)}
    expected = np.einsum(subscripts, *arrays.values(), optimize=False)
    got = ef.evaluate(text, **arrays)
    assert np.asarray(got).dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(got, expected)


def test_dsl_weak_numbers_do_not_widen_a_product():
    x = np.ones(4, np.float32)
    assert ef.evaluate("s = 0.5 x[i] x[i] x[i]", x=x).dtype == np.float32
    assert ef.evaluate("s = c x[i] x[i] x[i]", x=x, c=0.5).dtype == np.float32
    n = np.full(100, 2, np.int8)
    assert float(ef.evaluate("s = 0.5 n[i] n[i]", n=n)) == 200.0  # numpy: einsum('i,i,', n, n, 0.5)


def test_dask_operands_follow_the_dtype_rule():
    da = pytest.importorskip("dask.array")
    flags = np.ones(3, bool)
    got = ef.einsum("i,i,->", da.from_array(flags), da.from_array(flags), np.float64(1.0))
    assert float(np.asarray(got)) == 3.0

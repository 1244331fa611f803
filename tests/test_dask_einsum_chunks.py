"""Output chunks on dask: ``ef.einsum`` and programs keep every block near the inputs' largest chunk, as
``dask.array.einsum`` does (dask's ``test_einsum_chunksizes``, rewritten; references: dask's own einsum and
numpy).

Only graphs are built for the large cases (nothing is computed); values are checked on small ones.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import dask
import dask.array as da
import numpy as np
import pytest

import einflow as ef


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=da.PerformanceWarning)
        yield


def _largest_block_bytes(array: da.Array) -> int:
    return math.prod(max(sizes) for sizes in array.chunks) * array.dtype.itemsize


def test_ef_einsum_passes_dasks_einsum_chunksizes() -> None:
    rng = da.random.default_rng(0)
    cases = [
        ((1024, 8, 8, 8, 8), (256, 8, 8, 8, 8), (256, 8, 8, 8, 8)),
        ((64, 8, 8, 8, 8), (32, 8, 1, 8, 8), (32, 8, 8, 1, 8)),
    ]
    for shape, left, right in cases:
        a, b = rng.random(shape, chunks=left), rng.random(shape, chunks=right)
        assert ef.einsum("aijkl,amnop->ijklmnop", a, b).chunks == \
            da.einsum("aijkl,amnop->ijklmnop", a, b).chunks
    x, y = np.random.default_rng(1).random((2, 2, 4, 4))
    a, b = da.from_array(x, chunks=(1, 2, 2)), da.from_array(y, chunks=(1, 2, 2))
    value = ef.einsum("aij,amn->ijmn", a, b)
    assert value.chunks == da.einsum("aij,amn->ijmn", a, b).chunks == ((1,) * 4,) * 4
    np.testing.assert_allclose(value.compute(), np.einsum("aij,amn->ijmn", x, y), rtol=1e-12)


def test_ef_einsum_does_not_cut_a_small_intermediate_below_the_inputs_chunks() -> None:
    # dask's GH11627: a three-operand einsum whose pairwise intermediate (bfc,dfe->bcde) is small stays one block
    z = da.ones((40000, 2, 10, 2, 10), chunks=-1)
    x = da.ones((2, 10, 10), chunks=-1)
    assert ef.einsum("abcde,bfc,dfe->acef", z, x, x).numblocks == (1, 1, 1, 1)
    program = ef.compile("R[a,c,e,f] = Z[a,b,c,d,e] X[b,f,c] Y[d,f,e]")
    assert program(Z=z, X=x, Y=x).numblocks == (1, 1, 1, 1)
    chunked = z.rechunk((40000, 1, 5, 2, 10))
    assert ef.einsum("abcde,bfc,dfe->acef", chunked, x, x).chunks == \
        da.einsum("abcde,bfc,dfe->acef", chunked, x, x).chunks


def test_an_outer_product_of_a_2_mib_chunk_is_cut_near_the_input_chunk() -> None:
    x, y = da.ones(2**18, chunks=-1), da.ones(64, chunks=-1)  # one 2 MiB chunk and a short vector
    for value in (ef.compile("P[i,j] = x[i] y[j]")(x=x, y=y), ef.einsum("i,j->ij", x, y)):
        assert value.shape == (2**18, 64)
        # 128 MiB in one block before; dask's einsum bounds a block by the largest input chunk times its tolerance
        assert x.nbytes / 8 <= _largest_block_bytes(value) <= 1.25 * x.nbytes
        assert _largest_block_bytes(da.einsum("i,j->ij", x, y)) <= 1.25 * x.nbytes


def test_a_broadcast_outer_product_on_dask_is_numpys() -> None:
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal(1024), rng.standard_normal(32)
    lazy_x, lazy_y = da.from_array(x, chunks=-1), da.from_array(y, chunks=-1)
    program = ef.compile("P[i,j] = exp(x[i]) + 2 y[j] x[i]\nQ[i,j] = x[i] x[j]\nP, Q")
    P, Q = program(x=lazy_x, y=lazy_y)
    assert P.numblocks[1] > 1 and _largest_block_bytes(P) <= 1.25 * lazy_x.nbytes
    assert _largest_block_bytes(Q) <= 1.25 * lazy_x.nbytes
    np.testing.assert_allclose(P.compute(), np.exp(x)[:, None] + 2 * np.outer(x, y), rtol=1e-12)
    np.testing.assert_allclose(Q.compute(), np.outer(x, x), rtol=1e-12)


def test_dasks_chunk_size_tolerance_setting_is_respected() -> None:
    x, y = da.ones(2**18, chunks=-1), da.ones(64, chunks=-1)
    program = ef.compile("P[i,j] = x[i] y[j]")
    with dask.config.set({"array.chunk-size-tolerance": 4.0}):
        loose = _largest_block_bytes(program(x=x, y=y))
    tight = _largest_block_bytes(program(x=x, y=y))
    assert tight <= 1.25 * x.nbytes < loose <= 4.0 * x.nbytes

"""The same einflow program on numpy and on a dask LocalCluster, with the same result.

With dask arrays as inputs, einflow's dask backend builds one chunked task graph for the whole program
(opt_einsum plans each contraction on the chunks); ``.compute()`` runs it on the cluster's workers.
If dask or dask.distributed is not installed, the script says so and exits.

Run:  python examples/dask_vs_numpy.py
"""

from __future__ import annotations

import time

import numpy as np

import einflow as ef

PROGRAM = """
C[i,j] = A[i,k] B[k,j]
s[i] = tanh(C[i,j] / 30) v[j]
"""


def main(rows: int = 1200, inner: int = 1000, cols: int = 800, chunk: int = 400) -> None:
    try:
        import dask.array as da
        from distributed import Client, LocalCluster, get_task_stream
    except ImportError:
        print("dask is not installed: skipping the dask run (pip install 'einflow[dask]')")
        return
    program = ef.compile(PROGRAM)
    print(PROGRAM.strip())
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        # the data is made on the workers (not shipped inside the graph); numpy gets a copy of the same numbers
        rng = da.random.default_rng(0)
        chunked = {"A": rng.standard_normal((rows, inner), chunks=chunk),
                   "B": rng.standard_normal((inner, cols), chunks=chunk),
                   "v": rng.standard_normal(cols, chunks=chunk)}
        chunked = dict(zip(chunked, client.persist(list(chunked.values()))))
        arrays = {name: value.compute() for name, value in chunked.items()}
        print(f"A: {arrays['A'].shape}, B: {arrays['B'].shape}, v: {arrays['v'].shape}\n")

        start = time.perf_counter()
        on_numpy = program(**arrays, backend="numpy")
        print(f"numpy: {time.perf_counter() - start:.3f} s")

        try:
            lazy = program(**chunked, backend="dask")
        except ef.BackendError as error:
            print(f"einflow's dask backend is not available: skipping ({error})")
            return
        start = time.perf_counter()
        with get_task_stream(client) as stream:
            on_dask = lazy.compute()
        elapsed = time.perf_counter() - start
        workers = sorted({task["worker"] for task in stream.data})
        print(f"dask: {elapsed:.3f} s, {len(stream.data)} tasks on {len(workers)} workers "
              f"of a LocalCluster with {len(client.scheduler_info()['workers'])} workers, chunks of {chunk}")

    difference = float(np.abs(on_dask - on_numpy).max())
    print(f"\nresult shape {on_dask.shape}; max |dask - numpy| = {difference:.2e}")
    print("results agree" if np.allclose(on_dask, on_numpy, rtol=1e-10, atol=1e-10) else "results DIFFER")


if __name__ == "__main__":
    main()

# Each target sets up .venv itself (idempotent), then runs. The demo installs only einflow and its
# runtime dependencies; test, bench and lint add the test extras. Each install has its own stamp.
PY := .venv/bin/python
BASE := .venv/.installed-base
TESTING := .venv/.installed-test

.PHONY: demo test test-quick test-full bench lint clean

$(PY):
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip

$(BASE): $(PY) pyproject.toml
	$(PY) -m pip install -q -e .
	touch $(BASE)

$(TESTING): $(PY) pyproject.toml
	$(PY) -m pip install -q -e '.[test]'
	touch $(TESTING)

demo: $(BASE)
	$(PY) examples/demo.py

# make test: every test file and backend, the slow files (tests/conftest.py, SLOW_FILES) with fewer random
# programs. make test-quick: without the slow files. make test-full: everything at full size.
TEST_SIZES := EINFLOW_DIFF_N=400 EINFLOW_TORCH_RANDOM_N=40 EINFLOW_FAMILY_N=25 EINFLOW_OPERATORS_N=60
# Each target runs the files on TEST_WORKERS pytest-xdist workers, a whole file per worker (--dist loadfile), in
# the order tests/conftest.py gives them (the longest first: --no-loadscope-reorder); TEST_WORKERS=0 runs them
# in one process. One BLAS/OpenMP thread per worker: the workers are the parallelism (two workers each
# spinning two BLAS threads on two cores would oversubscribe them).
TEST_WORKERS ?= 2
PARALLEL := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(TESTING)
	$(TEST_SIZES) $(PARALLEL) $(PY) -m pytest $(XDIST) --durations=15

test-quick: $(TESTING)
	$(PARALLEL) $(PY) -m pytest $(XDIST) -m "not slow"

test-full: $(TESTING)
	$(PARALLEL) $(PY) -m pytest $(XDIST) --durations=15

bench: $(TESTING)
	$(PY) benchmarks/run_all.py

lint: $(TESTING)
	$(PY) -m ruff check einflow tests benchmarks examples
	$(PY) -m mypy

clean:
	rm -rf .venv build *.egg-info .mypy_cache

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

# make test: every test file and backend; the slow files (tests/conftest.py, SLOW_FILES) last, with fewer random
# programs. make test-quick: without the slow files. make test-full: everything at full size.
TEST_SIZES := EINFLOW_DIFF_N=400 EINFLOW_TORCH_RANDOM_N=40 EINFLOW_FAMILY_N=25 EINFLOW_OPERATORS_N=60

test: $(TESTING)
	$(TEST_SIZES) $(PY) -m pytest --durations=15

test-quick: $(TESTING)
	$(PY) -m pytest -m "not slow"

test-full: $(TESTING)
	$(PY) -m pytest --durations=15

bench: $(TESTING)
	$(PY) benchmarks/run_all.py

lint: $(TESTING)
	$(PY) -m ruff check einflow tests benchmarks examples
	$(PY) -m mypy

clean:
	rm -rf .venv build *.egg-info .mypy_cache

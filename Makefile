# Each target sets up .venv itself (idempotent), then runs. The demo installs only einflow and its
# runtime dependencies; test, bench and lint add the test extras. Each install has its own stamp.
PY := .venv/bin/python
BASE := .venv/.installed-base
TESTING := .venv/.installed-test

.PHONY: demo test bench lint clean

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

test: $(TESTING)
	$(PY) -m pytest

bench: $(TESTING)
	$(PY) benchmarks/run_all.py

lint: $(TESTING)
	$(PY) -m ruff check einflow tests benchmarks examples
	$(PY) -m mypy

clean:
	rm -rf .venv build *.egg-info .mypy_cache

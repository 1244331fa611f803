# Each target sets up .venv itself (idempotent), then runs.
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: demo test bench lint clean

$(PY):
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(PY) -m ruff check einflow tests benchmarks examples

clean:
	rm -rf .venv build *.egg-info

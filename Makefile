# Two entry points, each doing all set-up on a fresh machine:
#   make demo   create .venv if missing, install schedc, solve an example, check the schedule file, compare
#   make test   create .venv if missing, install schedc, run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.schedc-installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch pinned where none is installed: an unpinned torch would pull the CUDA wheels.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "torch==2.13.0"
	$(BIN)/python -m pip install -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/schedc solve examples/problems/skewed.yaml -o out/skewed.json --time-limit 60
	$(BIN)/schedc check out/skewed.json
	$(BIN)/schedc compare examples/problems/uniform.yaml --plot out/compare.png
	$(BIN)/schedc show examples/problems/uniform.yaml --schedule zb-h1 -o out/zb-h1.png --trace out/zb-h1.trace.json

# One pytest worker per core (pytest-xdist); worksteal keeps both busy to the end.
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist worksteal

bench: $(STAMP)
	$(BIN)/python benchmarks/simulate.py

clean:
	rm -rf $(VENV) out

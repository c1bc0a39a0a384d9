# Two entry points, each doing all set-up on a fresh machine:
#   make demo   create .venv if missing, install schedc (what the demo runs), solve an example,
#               check the schedule file, compare
#   make test   the same install plus the test tools (pyproject's "dev" extra), run the test suite
# Each installed set leaves a stamp in .venv, so `make test` after `make demo` adds the test tools,
# and an edited pyproject.toml reinstalls both.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP_DEMO := $(VENV)/.schedc-installed
STAMP_TEST := $(VENV)/.schedc-installed-dev

.PHONY: demo test bench clean

$(STAMP_DEMO): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch pinned where none is installed: an unpinned torch would pull the CUDA wheels.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "torch==2.13.0"
	$(BIN)/python -m pip install -e .
	touch $(STAMP_DEMO)

$(STAMP_TEST): $(STAMP_DEMO)
	$(BIN)/python -m pip install -e ".[dev]"
	touch $(STAMP_TEST)

demo: $(STAMP_DEMO)
	$(BIN)/schedc solve examples/problems/skewed.yaml -o out/skewed.json --time-limit 60
	$(BIN)/schedc check out/skewed.json
	$(BIN)/schedc compare examples/problems/uniform.yaml --plot out/compare.png
	$(BIN)/schedc show examples/problems/uniform.yaml --schedule zb-h1 -o out/zb-h1.png --trace out/zb-h1.trace.json

# One pytest worker per core (pytest-xdist); worksteal keeps both busy to the end.
test: $(STAMP_TEST)
	$(BIN)/python -m pytest -n auto --dist worksteal

bench: $(STAMP_DEMO)
	$(BIN)/python benchmarks/simulate.py

clean:
	rm -rf $(VENV) out

# `make demo`: set up .venv (when missing) and run the main job on built-in defaults.
# `make test`: set up .venv (when missing; with Triton for its kernel tests) and run the test suite.
# (onnxruntime-extensions is installed for benchmarks/ort_bridge.py, which compares with its PyOp.)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS := openvino,tensorrt-rtx,view,dev

.PHONY: setup demo test lint bench clean

# the C extensions are built at install: a change to their sources installs again
NATIVE := $(wildcard src/opbridge/*.h src/opbridge/*/*.c src/opbridge/*/*.h)
NEED_PYTHON := import sys; sys.exit(sys.version_info < (3, 11))

$(VENV)/.installed: pyproject.toml constraints.txt setup.py $(NATIVE)
	@$(PYTHON) -c '$(NEED_PYTHON)' || { echo "opbridge needs Python 3.11 or newer; $(PYTHON) is $$($(PYTHON) -V 2>&1). Run make PYTHON=python3.11 (or newer)."; exit 1; }
	@if test -x $(PY) && ! $(PY) -c '$(NEED_PYTHON)'; then echo "$(VENV) holds an older Python; making it again"; rm -rf $(VENV); fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[$(EXTRAS)]' onnxruntime-extensions
	touch $@

# the test suite also runs the Triton GPU kernels in Triton's CPU interpreter
$(VENV)/.kernel-tests: $(VENV)/.installed
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[kernel-tests]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/opbridge demo

test: setup $(VENV)/.kernel-tests
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples
	$(VENV)/bin/mypy --ignore-missing-imports --follow-imports=silent src/opbridge

bench: setup
	$(PY) benchmarks/ort_bridge.py
	$(PY) benchmarks/cpu_ops.py

clean:
	rm -rf $(VENV) build src/*.egg-info
	find src -name '*.so' -delete

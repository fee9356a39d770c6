# The two commands of the README: `make lab` (JupyterLab on the tutorials) and `make test`.
# Both set up everything on a fresh machine: .venv with the package and its dev extras, the
# `pwkernel` Jupyter kernel, and the browser the UI tests drive (Debian's chromium).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup lab test lint browser notebooks constraints clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]" -c constraints.txt
	@if $(PY) -c "import pwkernel.notebook.kernelspec" 2>/dev/null; then \
		$(PY) -m pwkernel.notebook.kernelspec install; fi
	sh extension/setup.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP)

# Debian's chromium for the browser tests (never a browser download of a test tool's own).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		$(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y -qq chromium chromium-driver >/dev/null; }

# Jupyter refuses root unless told: containers and CI run as root, so say it there.
ALLOW_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
LAB_ARGS ?=

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ALLOW_ROOT) $(LAB_ARGS)

test: setup browser
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check pwkernel tests notebooks bench

# The tutorials' .ipynb files, generated from their sources notebooks/NN_*.py.
notebooks: setup
	$(PY) -m pwkernel.notebook.tutorials

# After upgrading packages in .venv (and testing them): pin what is installed now.
constraints: setup
	@{ sed -n '1,2p' constraints.txt; $(PY) -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) build dist *.egg-info test-artifacts

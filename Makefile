# Thin wrapper over CMake. The two entry points a new machine needs:
#   make demo   install dependencies, build, run a 16-rank job under neuronrun
#   make test   install dependencies, build, run every test (ctest)
# Python: a virtual environment in $(VENV) with requirements.txt (torch 2.13
# CPU); Debian's packages for the C++ dependencies (scripts/install-deps.sh).
BUILD_DIR ?= build
JOBS ?= 2
# Tests run one at a time: two side by side slow each other (2 cores; the
# suite's CPU work is most of its time once torch is imported once), so
# each test's own time is what it costs alone. TEST_JOBS=2 runs two.
TEST_JOBS ?= 1
VENV ?= .venv
BASE_PYTHON ?= python3
PYTHON := $(abspath $(VENV))/bin/python

.PHONY: all deps venv configure build test demo bench install clean

all: build

deps:
	./scripts/install-deps.sh

# The venv is remade when requirements.txt changes.
venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt | deps
	@[ -x $(PYTHON) ] || $(BASE_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

configure: deps venv
	@if [ ! -f $(BUILD_DIR)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DNEURON_PYTHON=$(PYTHON); \
	fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The suite's neuronrun jobs fork their Python ranks from one zygote
# (neuronrun zygote): torch and the trainers' modules are imported once for
# the whole run, not once a job. A job whose ranks would see other settings
# starts its own, as without it.
test: build
	cd $(BUILD_DIR) && ./launcher/neuronrun zygote -- ctest --output-on-failure -j $(TEST_JOBS)

demo: build
	$(BUILD_DIR)/launcher/neuronrun -n 16 examples/08_upstream_gpt.py --pp 2 --tp 2 --compile --steps 8 --data counting

bench: build
	$(PYTHON) benchmarks/launcher_bench.py --neuronrun $(BUILD_DIR)/launcher/neuronrun

# Puts neuronrun, neuron-cc-perf and the torchneuron package into the venv
# (its bin/ and site-packages), or under PREFIX.
PREFIX ?= $(abspath $(VENV))
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD_DIR)

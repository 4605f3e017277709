# Thin wrapper over CMake. The two entry points a new machine needs:
#   make demo   install dependencies, build, run a 16-rank job under neuronrun
#   make test   install dependencies, build, run every test (ctest)
BUILD_DIR ?= build
JOBS ?= 2
PYTHON ?= /usr/bin/python3

.PHONY: all deps configure build test demo bench clean

all: build

deps:
	./scripts/install-deps.sh

configure: deps
	@if [ ! -f $(BUILD_DIR)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release \
	    -DNEURON_PYTHON=$(PYTHON) -DPython3_EXECUTABLE=$(PYTHON); \
	fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600

demo: build
	$(BUILD_DIR)/launcher/neuronrun -n 16 examples/04_train_gpt.py --tp 2 --pp 2 --zero 3 --clip 1.0

bench: build
	$(PYTHON) benchmarks/launcher_bench.py --neuronrun $(BUILD_DIR)/launcher/neuronrun

clean:
	rm -rf $(BUILD_DIR)

# Thin wrapper over CMake. `make run` and `make test` work on a fresh Debian 12
# machine as root: they install what is missing first (scripts/deps.sh).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build test run train asan-test bench fuzz lint clean

all: build

deps:
	@scripts/deps.sh

$(BUILD)/CMakeCache.txt:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: deps $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j$(JOBS) > $(BUILD)/build.log 2>&1 || { cat $(BUILD)/build.log; exit 1; }
	@grep -E 'warning:|error:' $(BUILD)/build.log || true

test: build
	@scripts/run_tests.sh $(BUILD)

run: build
	@$(BUILD)/tide scripts/run.lua

# the trained model: corpus, tokenizer, PyTorch training (~1 h on 2 cores), export (scripts/train/)
train: build
	@scripts/train/pipeline.sh

asan-test: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTIDE_SANITIZE=address,undefined > /dev/null
	@cmake --build build-asan -j$(JOBS) > build-asan/build.log 2>&1 || { cat build-asan/build.log; exit 1; }
	@scripts/run_tests.sh build-asan

bench: build
	@$(BUILD)/tide scripts/bench.lua

fuzz: deps
	@scripts/fuzz.sh $(FUZZ_SECONDS)

lint:
	@luacheck --quiet --no-color lua scripts tests/lua

clean:
	@rm -rf $(BUILD) build-asan build-fuzz

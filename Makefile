# Thin wrapper over CMake. `make run` and `make test` work on a fresh Debian 12
# machine as root: they install what is missing first (scripts/deps.sh).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build test run train asan-test bench fuzz soak lint clean

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

# The whole suite (C tests, every Lua spec, the CLI tests) against an ASan +
# UBSan build; the first finding fails the test that made it (ASAN_OPTIONS
# and UBSAN_OPTIONS are set for every test by CMakeLists.txt). Slow: the
# per-test time limit is raised, and the total time is printed.
asan-test: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTIDE_SANITIZE=address,undefined > /dev/null
	@cmake --build build-asan -j$(JOBS) > build-asan/build.log 2>&1 || { cat build-asan/build.log; exit 1; }
	@grep -E 'warning:|error:' build-asan/build.log || true
	@start=$$(date +%s); TIDE_TEST_TIMEOUT=3600 scripts/run_tests.sh build-asan; rc=$$?; \
	  echo "asan-test: $$(( $$(date +%s) - start )) s"; exit $$rc

bench: build
	@$(BUILD)/tide scripts/bench.lua

# every libFuzzer target, FUZZ_SECONDS each (default 60), one after the other
fuzz: deps
	@scripts/fuzz.sh $(FUZZ_SECONDS)

# scripts/soak.lua: SOAK_REQUESTS engine requests (default 2000) on a small
# generated checkpoint, every way a request can end, counters back to baseline
SOAK_REQUESTS ?= 2000
SOAK_MODEL = $(BUILD)/models/soak
soak: build
	@test -f $(SOAK_MODEL)/config.json || $(BUILD)/tide scripts/make_checkpoint.lua --preset tiny \
	  --set n_routed_experts=8 --set num_experts_per_tok=2 --quiet --out $(SOAK_MODEL)
	@$(BUILD)/tide scripts/soak.lua --model $(SOAK_MODEL) --requests $(SOAK_REQUESTS)

lint:
	@luacheck --quiet --no-color lua scripts tests/lua

clean:
	@rm -rf $(BUILD) build-asan build-fuzz

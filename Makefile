# The user-facing commands. Each installs dependencies first (idempotent), then builds into build/.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup build run test bench clean

setup:
	@scripts/setup.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: setup $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

# A fresh run every time: the example's checkpoints go to build/checkpoints/tiny-moe.
run: build
	rm -rf $(BUILD_DIR)/checkpoints/tiny-moe
	$(BUILD_DIR)/bin/moetrain run examples/tiny-moe.yaml --checkpoint-dir $(BUILD_DIR)/checkpoints

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

bench: build
	$(BUILD_DIR)/bin/moe_layer_bench --json

clean:
	rm -rf $(BUILD_DIR)

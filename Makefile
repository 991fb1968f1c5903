# Thin front for CMake. `make deps` installs the Debian packages, `make`
# builds, `make test` runs every test, `make run` generates from stories260K.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
MODEL ?= ../shared/models/stories260K.gguf

.PHONY: all deps test run clean

all:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

deps:
	apt-get update
	apt-get install -y --no-install-recommends cmake g++ make pkg-config \
	  libsentencepiece-dev libcxxopts-dev libgtest-dev nlohmann-json3-dev

test: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

run: all
	$(BUILD)/runlm generate -m $(MODEL) -n 200 --temp 0

clean:
	rm -rf $(BUILD)

# The two commands of the README, and the everyday build. CMake does the real work in build/;
# the sanitizer build lives in build-asan/.
#   make        build ember (build/ember) and the tests
#   make test   install dependencies; build with clang + ASan/UBSan and run the suite and the
#               fuzzers; then build with gcc and run the suite again
#   make demo   install dependencies, build, and run the best end-to-end demonstration
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
CMAKE_FLAGS ?=

.PHONY: all build test test-fast test-asan demo bootstrap clean format

all: build

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

bootstrap:
	@scripts/bootstrap

# The README's test command: everything CI runs.
test: bootstrap
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory test-fast

test-fast: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The sanitizer build uses clang, so the suite is also compiled by a second compiler, and the
# libFuzzer targets (clang only) are built and run there for their bounded time.
test-asan:
	@CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DEMBER_SANITIZE=address,undefined >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --output-on-failure -j $(JOBS) -LE no-sanitizer

demo: bootstrap build
	@scripts/demo

format:
	@clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan

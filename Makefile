# Build, install, test and benchmark sandbox-mcp. CI runs `make test` (.ci/run).
SHELL := /bin/bash
.DEFAULT_GOAL := build

PREFIX ?= $(HOME)/.local
CARGO ?= cargo
VENV := .venv-test
REQUIREMENTS := tests/requirements.txt

# One small image shared by every test run (built once, reused while present).
TEST_IMAGE_STORE := $(CURDIR)/target/test-images
TEST_IMAGE := mcp-test
TEST_PACKAGES := python3,git,curl,python3-pip,ca-certificates
# The docker tools' image (vm sandboxes): Debian's Docker Engine and Compose,
# and busybox-static, the binary the tests build FROM scratch images of.
DOCKER_TEST_IMAGE := mcp-docker
DOCKER_TEST_PACKAGES := python3,git,curl,ca-certificates,docker.io,docker-compose,busybox-static

DEBUG_BIN := $(CURDIR)/target/debug
RELEASE_BIN := $(CURDIR)/target/release

# `make test` runs pytest a second time as this unprivileged user (created
# if missing, set up with `sandbox-mcp host-setup`), on these test paths.
TEST_USER ?= smcp-test
USER_TESTS ?= tests/

# Kills the fault suite (tests/test_faults.py) makes under `make test-faults`; `make test` runs its
# small default. SANDBOX_MCP_FAULT_SEED picks the seed (else a random one, printed on failure).
FAULT_ROUNDS ?= 40

# Seconds each fuzz target runs: `make fuzz` (FUZZ_SECONDS) and within `make test` (TEST_FUZZ_SECONDS).
FUZZ_SECONDS ?= 20
TEST_FUZZ_SECONDS ?= 10

# The vm driver (qemu microVMs, `isolation = "vm"`): `make install` also installs
# qemu and builds the guest kernel and the installed helper's initramfs (idempotent:
# nothing is fetched or rebuilt when current), so a vm sandbox answers after it;
# `make install VM=0` leaves them out. The test setup always has them.
VM ?= 1
# TEST_TOOLS=1: `make deps` also installs what the OCI image tests run (a registry, skopeo, busybox).
TEST_TOOLS ?= 0
VM_DIR := $(CURDIR)/target/vm

.PHONY: swift-glue conformance deps build install deb dist test test-user test-faults test-vm test-vm-user test-install test-deb test-image test-image-docker test-docker venv bench clean-test fuzz vm vm-assets

deps:
	@SANDBOX_MCP_VM=$(VM) SANDBOX_MCP_TEST_TOOLS=$(TEST_TOOLS) scripts/install-deps.sh

# The vm driver's packages, then its guest kernel and the initramfs for
# VM_HELPER (cached in the data dir, or VM_ASSETS_DIR; quiet when built).
VM_HELPER ?= $(PREFIX)/bin/sandbox-vm-helper
vm:
	@SANDBOX_MCP_VM=1 scripts/install-deps.sh
	@$(MAKE) --no-print-directory vm-assets

vm-assets:
	@$(if $(VM_ASSETS_DIR),SANDBOX_MCP_VM_DIR=$(VM_ASSETS_DIR)) scripts/vm-kernel.sh
	@$(if $(VM_ASSETS_DIR),SANDBOX_MCP_VM_DIR=$(VM_ASSETS_DIR)) scripts/vm-initramfs.sh "$(VM_HELPER)"

build:
	$(CARGO) build --release

# Refreshes the swift-bridge glue committed in the Swift package (swift/Sources)
# from the bridge module; tests/swift_glue.rs fails while it is stale.
swift-glue:
	SANDBOX_MCP_WRITE_SWIFT_GLUE=1 $(CARGO) test --test swift_glue

# The helper conformance suite against a running helper, any platform's:
# `make conformance HELPER_SOCKET=/path/to/helper.sock` (a Mac user proves
# the Swift helper this way). Tests that start helpers of their own skip.
# The image the cases boot: a Mac's helper has the default image (pulled), Linux's the test image.
# CONFORMANCE_FILTER: only the cases whose names contain it (e.g. lifecycle_).
CONFORMANCE_IMAGE ?= $(if $(filter Darwin,$(shell uname -s)),mcp-dev,mcp-test)
conformance:
	@test -n "$(HELPER_SOCKET)" || { echo "make conformance: set HELPER_SOCKET=/path/to/helper.sock" >&2; exit 2; }
	SANDBOX_MCP_CONFORMANCE_SOCKET=$(HELPER_SOCKET) SANDBOX_MCP_TEST_IMAGE=$(CONFORMANCE_IMAGE) \
	    $(CARGO) test --test helper_conformance -- --test-threads=2 $(CONFORMANCE_FILTER)

# Binaries go in through a temp name and a rename, so a running helper
# (ETXTBSY on overwrite) does not block an upgrade. sandbox-ctl sits next to
# sandbox-mcp, which copies it into sandboxes whose spawn policy has inject_ctl.
# An ordinary user installs into ~/.local; sudo runs only apt-get (deps) and
# `sandbox-mcp host-setup` (when it would change something), each printed.
ifneq ($(shell uname -s),Darwin)
install: deps build
	@install -d "$(PREFIX)/bin"
	@for b in sandbox-mcp sandbox-vm-helper sandbox-ctl; do \
	    install -m 755 "$(RELEASE_BIN)/$$b" "$(PREFIX)/bin/.$$b.new" && \
	    mv -f "$(PREFIX)/bin/.$$b.new" "$(PREFIX)/bin/$$b" && \
	    echo "install: $(PREFIX)/bin/$$b"; \
	done
	@scripts/host-setup.sh "$(PREFIX)/bin/sandbox-mcp"
	@if [ "$(VM)" = 1 ]; then $(MAKE) --no-print-directory vm-assets VM_HELPER="$(PREFIX)/bin/sandbox-vm-helper"; fi
	"$(PREFIX)/bin/sandbox-mcp" image build
	@scripts/print-registration.sh "$(abspath $(PREFIX))/bin/sandbox-mcp"
endif

# ---- The macOS helper (issue 13, swift/README.md) -------------------------------------------
# `make helper`: the Swift helper alone (the Rust static library for aarch64-apple-darwin, then
# `swift build -c release` in swift/, signed with the virtualization entitlement). `make install`
# on macOS (uname -s = Darwin): that helper, the guest kernel, our agent cross-compiled for
# aarch64-unknown-linux-musl, sandbox-mcp and sandbox-ctl, then the registration as on Linux.
# `make check-swift`: the Linux checks of swift/ (tree-sitter syntax, containerization's API).
# `make check-portable`: the crate built as a Mac builds it, without its Linux-only parts (build.rs,
# `cfg(linux_host)`): no machine here has an Apple target's standard library, so Linux stands in.
UNAME_S := $(shell uname -s)
SWIFT_DIR := $(CURDIR)/swift
MAC_RUST_TARGET := aarch64-apple-darwin
GUEST_RUST_TARGET := aarch64-unknown-linux-musl
SWIFT_HELPER := $(SWIFT_DIR)/.build/release/sandbox-vm-helper
MAC_VM_DIR ?= $(or $(SANDBOX_MCP_VM_DIR),$(or $(XDG_DATA_HOME),$(HOME)/.local/share)/sandbox-mcp/vm)
# The Mac's default image (mcp-dev): pulled by the helper at the first boot; Python, git, curl,
# a compiler and apt, as close to Linux's mcp-dev as a public image comes.
MAC_DEFAULT_IMAGE ?= docker.io/library/python:3.12-bookworm
# The guest kernel containerization's own Makefile fetches (Kata's arm64 vmlinux.container).
KATA_ARM64 ?= https://github.com/kata-containers/kata-containers/releases/download/3.17.0/kata-static-3.17.0-arm64.tar.xz
.PHONY: helper check-swift check-portable check-layers lint install-macos mac-guest-kernel mac-guest-agent

check-swift: venv
	@$(VENV)/bin/python scripts/check-swift.py

# The workspace's layering (each crate uses only lower ones) and no Rust file over 800 lines.
check-layers:
	@scripts/check-layers.py

# clippy on every target of the workspace, warnings denied (a few minutes from a clean target dir).
lint:
	@$(CARGO) clippy --quiet --all-targets -- -D warnings && echo "lint: clippy clean"

check-portable:
	@SANDBOX_MCP_PORTABLE_CHECK=1 CARGO_TARGET_DIR=$(CURDIR)/target/portable RUSTFLAGS="-D warnings" \
	    $(CARGO) check --quiet -p sandbox-mcp -p sandbox-helper-ffi --lib --bins && \
	    echo "check-portable: the crate and the Swift helper's static library build without the Linux-only parts"

helper:
ifeq ($(UNAME_S),Darwin)
	rustup target add $(MAC_RUST_TARGET) >/dev/null
	$(CARGO) build --release -p sandbox-helper-ffi --target $(MAC_RUST_TARGET)
	cd $(SWIFT_DIR) && SANDBOX_MCP_RUST_LIB_DIR=$(CURDIR)/target/$(MAC_RUST_TARGET)/release swift build -c release
	codesign --force --sign - --entitlements $(SWIFT_DIR)/entitlements.plist $(SWIFT_HELPER)
	@echo "helper: $(SWIFT_HELPER) (signed with com.apple.security.virtualization)"
else
	@echo "make helper: the Swift helper (Virtualization.framework, Apple's containerization) builds on macOS on Apple silicon only; on $(UNAME_S) the helper is target/release/sandbox-vm-helper from \`make build\`, and \`make check-swift\` checks swift/ here" >&2; exit 1
endif

mac-guest-kernel:
	@mkdir -p "$(MAC_VM_DIR)"
	@if [ ! -s "$(MAC_VM_DIR)/vmlinux" ]; then \
	    tmp=$$(mktemp -d) && curl -fsSL -o "$$tmp/kata.tar.xz" "$(KATA_ARM64)" && \
	    tar -xf "$$tmp/kata.tar.xz" -C "$$tmp" && \
	    cp -L "$$(find "$$tmp" -name vmlinux.container | head -n 1)" "$(MAC_VM_DIR)/vmlinux" && rm -rf "$$tmp" && \
	    echo "install: guest kernel $(MAC_VM_DIR)/vmlinux"; \
	fi

# The agent runs in the guest (Linux, arm64): cargo-zigbuild cross-compiles it and its C parts, and
# sandbox-ctl, which the orchestrator copies into sandboxes from beside sandbox-mcp.
mac-guest-agent:
	@command -v cargo-zigbuild >/dev/null || { echo "install: the guest agent needs cargo-zigbuild (brew install zig && cargo install cargo-zigbuild)" >&2; exit 1; }
	rustup target add $(GUEST_RUST_TARGET) >/dev/null
	$(CARGO) zigbuild --release --target $(GUEST_RUST_TARGET) --bin sandbox-vm-helper --bin sandbox-ctl
	@install -d "$(MAC_VM_DIR)/aarch64-linux-musl"
	@install -m 755 target/$(GUEST_RUST_TARGET)/release/sandbox-vm-helper "$(MAC_VM_DIR)/aarch64-linux-musl/sandbox-vm-helper"
	@echo "install: guest agent $(MAC_VM_DIR)/aarch64-linux-musl/sandbox-vm-helper"

install-macos: helper mac-guest-kernel mac-guest-agent
	$(CARGO) build --release --bin sandbox-mcp
	@install -d "$(PREFIX)/bin"
	@for b in $(RELEASE_BIN)/sandbox-mcp target/$(GUEST_RUST_TARGET)/release/sandbox-ctl; do \
	    n=$$(basename $$b); install -m 755 "$$b" "$(PREFIX)/bin/.$$n.new" && mv -f "$(PREFIX)/bin/.$$n.new" "$(PREFIX)/bin/$$n" && \
	    echo "install: $(PREFIX)/bin/$$n"; \
	done
	@install -m 755 "$(SWIFT_HELPER)" "$(PREFIX)/bin/.sandbox-vm-helper.new"
	@codesign --force --sign - --entitlements $(SWIFT_DIR)/entitlements.plist "$(PREFIX)/bin/.sandbox-vm-helper.new"
	@mv -f "$(PREFIX)/bin/.sandbox-vm-helper.new" "$(PREFIX)/bin/sandbox-vm-helper" && echo "install: $(PREFIX)/bin/sandbox-vm-helper"
	@"$(PREFIX)/bin/sandbox-mcp" image list | grep -q '^mcp-dev	' || \
	    "$(PREFIX)/bin/sandbox-mcp" image pull $(MAC_DEFAULT_IMAGE) --name mcp-dev --shell /bin/bash --package-manager apt
	@scripts/print-registration.sh "$(abspath $(PREFIX))/bin/sandbox-mcp"

ifeq ($(shell uname -s),Darwin)
install: install-macos
endif
# ---- end of the macOS helper's block ----------------------------------------------------------

venv:
	@scripts/venv.sh $(VENV) $(REQUIREMENTS)

test-image:
	@scripts/test-image.sh "$(DEBUG_BIN)/sandbox-mcp" "$(TEST_IMAGE_STORE)" $(TEST_IMAGE) $(TEST_PACKAGES)

test-image-docker:
	@scripts/test-image.sh "$(DEBUG_BIN)/sandbox-mcp" "$(TEST_IMAGE_STORE)" $(DOCKER_TEST_IMAGE) $(DOCKER_TEST_PACKAGES)

# The docker tools on a vm sandbox (heavy: dockerd under TCG) and in the
# guest at driver level, after the docker image and the vm assets.
test-docker: export SANDBOX_MCP_TEST_IMAGE_STORE := $(TEST_IMAGE_STORE)
test-docker: export SANDBOX_MCP_TEST_IMAGE := $(TEST_IMAGE)
test-docker: export SANDBOX_MCP_DOCKER_TEST_IMAGE := $(DOCKER_TEST_IMAGE)
test-docker: export SANDBOX_MCP_BIN := $(DEBUG_BIN)/sandbox-mcp
test-docker: export SANDBOX_VM_HELPER_BIN := $(DEBUG_BIN)/sandbox-vm-helper
test-docker: export SANDBOX_MCP_VM_DIR := $(VM_DIR)
test-docker: deps venv
	$(CARGO) build --quiet
	@$(MAKE) --no-print-directory test-image test-image-docker
	@$(MAKE) --no-print-directory vm-assets VM_ASSETS_DIR=$(VM_DIR) VM_HELPER=$(DEBUG_BIN)/sandbox-vm-helper
	$(CARGO) test --quiet --test vm_qemu dockerd
	$(VENV)/bin/python -m pytest -q -ra -p no:cacheprovider tests/test_docker.py

test: export SANDBOX_MCP_TEST_IMAGE_STORE := $(TEST_IMAGE_STORE)
test: export SANDBOX_MCP_TEST_IMAGE := $(TEST_IMAGE)
test: export SANDBOX_MCP_BIN := $(DEBUG_BIN)/sandbox-mcp
test: export SANDBOX_VM_HELPER_BIN := $(DEBUG_BIN)/sandbox-vm-helper
test: export SANDBOX_MCP_VM_DIR := $(VM_DIR)
test: VM := 1
test: TEST_TOOLS := 1
test: deps venv
	$(CARGO) build --quiet
	@$(MAKE) --no-print-directory test-image
	@$(MAKE) --no-print-directory vm-assets VM_ASSETS_DIR=$(VM_DIR) VM_HELPER=$(DEBUG_BIN)/sandbox-vm-helper
	@status=0; scripts/run-tests.sh $(VENV) || status=1; \
	    $(MAKE) --no-print-directory check-swift || status=1; \
	    $(MAKE) --no-print-directory check-portable || status=1; \
	    $(MAKE) --no-print-directory check-layers || status=1; \
	    $(MAKE) --no-print-directory lint || status=1; \
	    $(MAKE) --no-print-directory test-user || status=1; \
	    FUZZ_OPTIONAL=1 FUZZ_SECONDS=$(TEST_FUZZ_SECONDS) scripts/fuzz.sh || status=1; exit $$status

# Runs every fuzz target for FUZZ_SECONDS each (needs nightly and cargo-fuzz).
fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh

# The unprivileged pass (scripts/test-user.sh); needs root to set the user up.
test-user: export SANDBOX_MCP_TEST_IMAGE := $(TEST_IMAGE)
test-user: export SANDBOX_MCP_BIN := $(DEBUG_BIN)/sandbox-mcp
test-user: export SANDBOX_VM_HELPER_BIN := $(DEBUG_BIN)/sandbox-vm-helper
test-user:
	$(CARGO) build --quiet
	@scripts/test-user.sh $(TEST_USER) $(TEST_PACKAGES) $(USER_TESTS)

# The fault suite at FAULT_ROUNDS kills, as root and then in the unprivileged pass (its pytest file
# alone: `make test`'s pass ran the rest as that user). Heavier than its share of `make test`:
# .ci/run runs it afterwards when the CI time budget allows.
test-faults: export SANDBOX_MCP_TEST_IMAGE_STORE := $(TEST_IMAGE_STORE)
test-faults: export SANDBOX_MCP_TEST_IMAGE := $(TEST_IMAGE)
test-faults: export SANDBOX_MCP_BIN := $(DEBUG_BIN)/sandbox-mcp
test-faults: export SANDBOX_VM_HELPER_BIN := $(DEBUG_BIN)/sandbox-vm-helper
test-faults: export SANDBOX_MCP_FAULT_ROUNDS := $(FAULT_ROUNDS)
test-faults: deps venv
	$(CARGO) build --quiet
	@$(MAKE) --no-print-directory test-image
	@status=0; $(VENV)/bin/python -m pytest -q -ra -p no:cacheprovider tests/test_faults.py || status=1; \
	    SMCP_USER_PYTEST_ONLY=1 $(MAKE) --no-print-directory test-user USER_TESTS=tests/test_faults.py || status=1; \
	    exit $$status

# The driver matrix's heavy half (issue 12), after `make test`: the helper conformance suite with
# every VM on the vm driver, then the MCP tool and security files below on vm sandboxes
# (SANDBOX_MCP_TEST_ISOLATION=vm: conftest's servers default to it), as root. Cases a vm cannot
# have skip by the driver's capabilities or a stated reason. TCG is slow: .ci/run runs it when the
# CI time budget allows; `make test` keeps its own vm cases. `make test-vm-user` runs the same
# matrix as the test user (scripts/test-user.sh): as long again, so not in CI's 90 minutes.
VM_TEST_FILES ?= tests/test_exec.py tests/test_files_env.py tests/test_process.py tests/test_lifecycle.py tests/test_comeback.py tests/test_keep.py \
    tests/test_images.py tests/test_security_escape.py
VM_MATRIX_ENV := SANDBOX_MCP_CONFORMANCE_DRIVER=vm SANDBOX_MCP_TEST_ISOLATION=vm
test-vm: export SANDBOX_MCP_TEST_IMAGE_STORE := $(TEST_IMAGE_STORE)
test-vm: export SANDBOX_MCP_TEST_IMAGE := $(TEST_IMAGE)
test-vm: export SANDBOX_MCP_BIN := $(DEBUG_BIN)/sandbox-mcp
test-vm: export SANDBOX_VM_HELPER_BIN := $(DEBUG_BIN)/sandbox-vm-helper
test-vm: export SANDBOX_MCP_VM_DIR := $(VM_DIR)
test-vm: VM := 1
test-vm: deps venv
	$(CARGO) build --quiet
	@$(MAKE) --no-print-directory test-image
	@$(MAKE) --no-print-directory vm-assets VM_ASSETS_DIR=$(VM_DIR) VM_HELPER=$(DEBUG_BIN)/sandbox-vm-helper
	@status=0; $(VM_MATRIX_ENV) $(CARGO) test --quiet --test helper_conformance || status=1; \
	    $(VM_MATRIX_ENV) $(VENV)/bin/python -m pytest -q -ra -p no:cacheprovider $(VM_TEST_FILES) || status=1; \
	    exit $$status

test-vm-user: VM := 1
test-vm-user:
	@$(VM_MATRIX_ENV) $(MAKE) --no-print-directory test-user USER_TESTS="$(VM_TEST_FILES)"

# Installing without a Rust toolchain (issue 26): `make deb` packages the release build for Debian
# (sandbox-mcp_VERSION_ARCH.deb: the three binaries, depending on mmdebstrap and uidmap, a postinst
# that only prints what each user runs next), `make dist` as a release archive
# (sandbox-mcp-VERSION-linux-ARCH.tar.gz), both in DIST_DIR (scripts/make-deb.sh).
DIST_DIR ?= $(CURDIR)/target/dist
deb: build
	@scripts/make-deb.sh deb "$(RELEASE_BIN)" "$(DIST_DIR)"
dist: build
	@scripts/make-deb.sh dist "$(RELEASE_BIN)" "$(DIST_DIR)"

# The package end to end (scripts/test-deb.sh): `apt-get install ./the.deb` as root, then a new
# ordinary user with no toolchain follows the postinst's steps and uses the server through a real
# MCP client; the package is removed afterwards. Heavy (a release build and the default image as
# that user): .ci/run runs it when the CI time budget allows. Needs root.
test-deb: deb venv
	@scripts/test-deb.sh "$(DIST_DIR)"

# `make install` end to end as a new ordinary user (scripts/test-install.sh):
# its sudo limited to apt-get and host-setup, a release build and the default
# image as that user, then the installed server through a real MCP client.
# Heavy (a release build and an image build); not part of `make test`:
# .ci/run runs it afterwards when the CI time budget allows. Needs root.
test-install:
	@scripts/test-install.sh

# Benchmarks the release build on the test image (built if missing).
bench: export SANDBOX_MCP_BIN := $(RELEASE_BIN)/sandbox-mcp
bench: export SANDBOX_VM_HELPER_BIN := $(RELEASE_BIN)/sandbox-vm-helper
bench: export SANDBOX_MCP_BENCH_IMAGE_STORE := $(TEST_IMAGE_STORE)
bench: export SANDBOX_MCP_BENCH_IMAGE := $(TEST_IMAGE)
bench: export SANDBOX_MCP_VM_DIR := $(VM_DIR)
bench: deps venv build
	@scripts/test-image.sh "$(RELEASE_BIN)/sandbox-mcp" "$(TEST_IMAGE_STORE)" $(TEST_IMAGE) $(TEST_PACKAGES)
	@# The vm figures need the guest kernel and the release helper's initramfs
	@# (without qemu the bench says so and skips them).
	-@$(MAKE) --no-print-directory vm-assets VM_ASSETS_DIR=$(VM_DIR) VM_HELPER=$(RELEASE_BIN)/sandbox-vm-helper
	$(VENV)/bin/python bench/bench.py

# Removes the test venv and the test image (the image is owned by shifted
# ids, so it needs the same privileges it was built with).
clean-test:
	rm -rf $(VENV) $(TEST_IMAGE_STORE)

#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for FUZZ_SECONDS seconds each
# (default 20), on its corpus in fuzz/corpus/<target> (kept between runs,
# seeded from fuzz/seeds/<target>). A crash stops the run and leaves its input
# in fuzz/artifacts/<target>/. cargo-fuzz is installed when missing. With
# FUZZ_OPTIONAL=1 (`make test`), a missing nightly toolchain (or a cargo-fuzz
# that cannot be installed) skips with the reason instead of failing.
set -euo pipefail
seconds=${FUZZ_SECONDS:-20}
cd "$(dirname "$0")/../fuzz"

missing=""
if ! cargo +nightly --version >/dev/null 2>&1; then
    missing="no nightly toolchain (rustup toolchain install nightly)"
elif ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    # From the crate registry, once: CI's clean machines have nightly but not
    # cargo-fuzz, and the issue wants the targets run there too.
    echo "fuzz: cargo install cargo-fuzz"
    if ! cargo install --quiet --locked cargo-fuzz >/dev/null 2>&1; then
        missing="cargo-fuzz is not installed and could not be (cargo install cargo-fuzz)"
    fi
fi
if [[ -n "$missing" ]]; then
    if [[ "${FUZZ_OPTIONAL:-0}" == 1 ]]; then
        echo "fuzz: skipped: $missing"
        exit 0
    fi
    echo "fuzz: $missing" >&2
    exit 1
fi

cargo +nightly fuzz build
for target in $(cargo +nightly fuzz list); do
    mkdir -p "corpus/$target"
    seeds=()
    [[ -d "seeds/$target" ]] && seeds=("seeds/$target")
    echo "fuzz: $target for ${seconds}s"
    log=$(mktemp)
    if ! cargo +nightly fuzz run "$target" "corpus/$target" "${seeds[@]}" -- \
        -max_total_time="$seconds" -max_len=4096 -timeout=20 >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        rm -f "$log"
        echo "fuzz: $target failed; the input is in fuzz/artifacts/$target/" >&2
        exit 1
    fi
    grep -E "^Done" "$log" || true
    rm -f "$log"
done

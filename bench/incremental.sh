#!/usr/bin/env bash
# Incremental build time of the test suite after a one-line change to one engine file: what a
# developer waits for between editing the engine and running its tests.
#
# Usage: bash bench/incremental.sh [FILE] [RUNS]
#   FILE defaults to the scheduler (the engine crate's exec.rs); RUNS to 3.
# Each run appends a distinct constant to FILE, times `cargo test --workspace --no-run`, and
# restores FILE. The first, untimed build brings the target directory up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:-}
if [ -z "$file" ]; then
    # The second path is the layout before the crates (to measure an older commit).
    for f in server/engine/src/exec.rs server/src/engine/exec.rs; do
        [ -f "$f" ] && file=$f && break
    done
fi
runs=${2:-3}
cp "$file" "$file.orig"
trap 'mv "$file.orig" "$file"' EXIT
cargo test --workspace --no-run --quiet >/dev/null 2>&1
for i in $(seq "$runs"); do
    cp "$file.orig" "$file"
    echo "const _: u32 = $i;" >>"$file"
    start=$(date +%s.%N)
    cargo test --workspace --no-run --quiet >/dev/null 2>&1
    end=$(date +%s.%N)
    printf 'run %d: %.1f s\n' "$i" "$(echo "$end - $start" | bc)"
done

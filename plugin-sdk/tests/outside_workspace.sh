#!/usr/bin/env bash
# The README's provider built as a plugin author builds it: a crate of its own, outside this
# workspace, that depends on the SDK by path (plugin-sdk/README.md, "Outside this repository").
# It uses this workspace's Cargo.lock and target directory, so nothing is downloaded and the
# SDK's dependencies are not built again. Then the binary runs by hand and must explain itself
# (exit code 2), as every SDK-built plugin does without the engine's environment.
#
#   bash plugin-sdk/tests/outside_workspace.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/trellis-provider-hello/src"
cat >"$tmp/trellis-provider-hello/Cargo.toml" <<EOF
[package]
name = "trellis-provider-hello"
version = "0.1.0"
edition = "2024"

[dependencies]
trellis-plugin-sdk = { path = "$root/plugin-sdk" }
EOF
cp "$root/plugin-sdk/examples/hello.rs" "$tmp/trellis-provider-hello/src/main.rs"
cp "$root/Cargo.lock" "$tmp/trellis-provider-hello/Cargo.lock"
target="${CARGO_TARGET_DIR:-$root/target}"
# The workspace's dev profile (Cargo.toml), so the dependencies this crate shares with the
# workspace build are reused rather than compiled again with other settings. What is checked
# does not change: the SDK's own features must be enough without the workspace's.
CARGO_TARGET_DIR="$target" cargo build --offline --quiet \
  --config 'profile.dev.debug="line-tables-only"' \
  --config 'profile.dev.package."*".opt-level=1' \
  --config 'profile.dev.package."*".debug=false' \
  --manifest-path "$tmp/trellis-provider-hello/Cargo.toml"
set +e
out="$("$target/debug/trellis-provider-hello" 2>&1)"
code=$?
set -e
if [ "$code" -ne 2 ] || ! grep -q "TRELLIS_PLUGIN_NONCE" <<<"$out"; then
  echo "the provider built outside the workspace did not explain itself (exit $code):" >&2
  echo "$out" >&2
  exit 1
fi
echo "outside the workspace: trellis-provider-hello builds and runs"

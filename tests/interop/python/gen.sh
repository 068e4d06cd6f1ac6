#!/usr/bin/env bash
# Generates the Python gRPC stubs for the Trellis plugin protocol and engine API
# from the repository's .proto files (proto/trellis/{plugin,engine}/v1/*.proto)
# into _gen/,
# which is untracked. Needs `pip install -r requirements.txt` (grpcio-tools
# bundles protoc).
#
#   gen.sh             regenerate unconditionally
#   gen.sh --if-stale  regenerate only when _gen/ is missing or was made from
#                      other .proto contents (what the launcher and the test do)
#
# Writes nothing to stdout: the launcher runs it before the plugin prints its
# handshake line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="$here/_gen"
# The engine API too: tests/interop/python/engine_client.py is a CI client in Python.
protos=("$root"/proto/trellis/plugin/v1/*.proto "$root"/proto/trellis/engine/v1/*.proto)

digest() { cat "${protos[@]}" | sha256sum | cut -d' ' -f1; }
fresh() { [ "$(cat "$out/PROTO_SHA256" 2>/dev/null || true)" = "$(digest)" ]; }

generate() {
  local tmp old
  tmp="$(mktemp -d "$here/.gen.XXXXXX")"
  if ! python3 -m grpc_tools.protoc -I "$root/proto" \
      --python_out="$tmp" --grpc_python_out="$tmp" "${protos[@]}" >&2; then
    rm -rf "$tmp"
    echo "gen.sh: protoc failed (is grpcio-tools installed? pip install -r $here/requirements.txt)" >&2
    return 1
  fi
  digest >"$tmp/PROTO_SHA256"
  if [ -e "$out" ]; then
    old="$(mktemp -d "$here/.gen.old.XXXXXX")"
    mv -T "$out" "$old/x"
    rm -rf "$old"
  fi
  mv -T "$tmp" "$out"
}

if [ "${1:-}" = "--if-stale" ]; then
  fresh && exit 0
  # Several plugin processes may start at once on a fresh clone: one generates,
  # the others wait for it and then find the stubs fresh.
  exec 9>"$here/.gen.lock"
  flock 9
  fresh && exit 0
fi
generate

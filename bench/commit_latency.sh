#!/usr/bin/env bash
# Commit latency of the two state stores: one unit of work per resource (an intent and its
# event, `StateStore::record_intent`), sequentially (N commits, p50/p90/p99/mean) and from W
# concurrent writers on instances of their own (commits/s). The program is
# server/state/examples/commit_latency.rs; each run gets a fresh SQLite data directory or a
# fresh PostgreSQL schema (dropped afterwards).
#
# Usage: bash bench/commit_latency.sh [PG_URL] [RUNS] [N] [WRITERS]
#   PG_URL   default postgres://root@127.0.0.1:5432/test ("none" skips PostgreSQL)
#   RUNS     default 3; N default 2000; WRITERS default 8
# CARGO_TARGET_DIR is honoured (build elsewhere than target/ while others use it).
set -euo pipefail
cd "$(dirname "$0")/.."
PG_URL=${1:-postgres://root@127.0.0.1:5432/test}
RUNS=${2:-3}
N=${3:-2000}
WRITERS=${4:-8}

cargo build --release -q -p trellis-state --example commit_latency
BIN="${CARGO_TARGET_DIR:-target}/release/examples/commit_latency"

"$BIN" --state sqlite --runs "$RUNS" --n "$N" --writers "$WRITERS"
if [ "$PG_URL" != none ]; then
    "$BIN" --state "$PG_URL" --runs "$RUNS" --n "$N" --writers "$WRITERS"
fi

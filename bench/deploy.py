#!/usr/bin/env python3
"""Deploy scheduling benchmark: `trellis deploy` wall time against the critical path.

Generates a blueprint of `sim/resource`s in LAYERS dependency layers (every resource in layer k
references one resource of layer k-1 through `${resources.X.state.id}`), each call taking
LATENCY ms, starts a real `trellis serve` (release build, bundled sim plugin) on a fresh data
directory, and measures:

- plan time: `trellis plan` against empty state (whole process, client included);
- deploy time: `trellis deploy --change-set ID` (whole process, watching to the end), divided
  by the critical path LAYERS x LATENCY;
- engine RSS: idle after start, and the peak sampled every 20 ms during the deploy.

Usage: python3 bench/deploy.py [--resources 1000 10000] [--layers 10] [--latency-ms 200]
Build first: cargo build --release --workspace
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# TRELLIS_BENCH_BIN: a directory holding copies of the binaries (so a rebuild in target/ cannot
# change them mid-run).
BIN = os.environ.get("TRELLIS_BENCH_BIN") or os.path.join(ROOT, "target", "release")


def blueprint(n, layers, latency):
    width = n // layers
    out = ["version: 2023-04-20", "resources:"]
    for k in range(layers):
        for j in range(width):
            out.append(f"  l{k}_{j}:")
            out.append("    type: sim/resource")
            out.append("    spec:")
            out.append(f"      latencyMs: {latency}")
            if k > 0:
                out.append(f"      payload: ${{resources.l{k - 1}_{j}.state.id}}")
    return "\n".join(out) + "\n"


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_s(pid):
    """User + system CPU seconds of a process (its reaped children excluded)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def children(pid):
    """Child processes (plugins), whichever of the engine's threads started them."""
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def run(n, layers, latency, parallel):
    work = tempfile.mkdtemp(prefix="trellis-bench-")
    try:
        path = os.path.join(work, "bench.yaml")
        with open(path, "w") as f:
            f.write(blueprint(n, layers, latency))
        engine = subprocess.Popen(
            [os.path.join(BIN, "trellis"), "serve", "--listen", "127.0.0.1:0",
             "--data-dir", os.path.join(work, "data"), "--max-parallel", str(parallel),
             "--log-level", "warn"],
            cwd=work, stdout=subprocess.PIPE, text=True)
        line = engine.stdout.readline()
        m = re.search(r"listening on (\S+)", line)
        if not m:
            raise SystemExit(f"engine did not start: {line!r}")
        addr = m.group(1)
        threading.Thread(target=engine.stdout.read, daemon=True).start()
        time.sleep(0.5)
        idle = rss_kib(engine.pid)

        def cli(*args):
            t = time.perf_counter()
            out = subprocess.run([os.path.join(BIN, "trellis"), *args, "--engine", addr,
                                  "--format", "json"], cwd=work, capture_output=True, text=True)
            dt = time.perf_counter() - t
            if out.returncode != 0:
                raise SystemExit(f"{args[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
            return dt, out.stdout

        plan_s, out = cli("plan", "bench.yaml", "--instance", "bench")
        cs = re.search(r'"id":\s*"(cs_[0-9a-f]+)"', out).group(1)

        peak = [0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss_kib(engine.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        plugins = children(engine.pid)
        cpu0 = cpu_s(engine.pid), sum(cpu_s(p) for p in plugins)
        deploy_s, _ = cli("deploy", "--change-set", cs)
        cpu1 = cpu_s(engine.pid), sum(cpu_s(p) for p in plugins)
        done.set()
        sampler.join()
        engine.terminate()
        engine.wait(timeout=60)
        critical = layers * latency / 1000
        return {
            "resources": n, "layers": layers, "latency_ms": latency, "parallel": parallel,
            "plan_s": plan_s, "deploy_s": deploy_s, "ratio": deploy_s / critical,
            "rss_idle_mib": idle / 1024, "rss_peak_mib": peak[0] / 1024,
            "engine_cpu_s": cpu1[0] - cpu0[0], "plugin_cpu_s": cpu1[1] - cpu0[1],
        }
    finally:
        if os.environ.get("TRELLIS_BENCH_KEEP"):
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resources", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--latency-ms", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=0,
                    help="--max-parallel of the engine (default: the layer width)")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(BIN, "trellis-provider-sim")):
        raise SystemExit("build first: cargo build --release --workspace")
    print("| resources | layers x latency | parallel | plan | deploy | deploy / critical path "
          "| RSS idle | RSS peak | engine CPU | plugin CPU |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in args.resources:
        parallel = args.parallel or max(1, n // args.layers)
        r = run(n, args.layers, args.latency_ms, parallel)
        print(f"| {n:,} | {args.layers} x {args.latency_ms} ms | {parallel} | {r['plan_s']:.2f} s "
              f"| {r['deploy_s']:.2f} s | {r['ratio']:.3f} | {r['rss_idle_mib']:.0f} MiB "
              f"| {r['rss_peak_mib']:.0f} MiB | {r['engine_cpu_s']:.2f} s "
              f"| {r['plugin_cpu_s']:.2f} s |", flush=True)


if __name__ == "__main__":
    sys.exit(main())

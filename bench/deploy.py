#!/usr/bin/env python3
"""Deploy scheduling benchmark: `trellis deploy` wall time against the critical path.

Generates a blueprint of `sim/resource`s in LAYERS dependency layers (every resource in layer k
references one resource of layer k-1 through `${resources.X.state.id}`), each call taking
LATENCY ms, starts a real `trellis serve` (release build, bundled sim plugin) on a fresh data
directory, and measures:

- plan time: `trellis plan` against empty state (whole process, client included);
- deploy time: `trellis deploy --change-set ID` (whole process, watching to the end), divided
  by the critical path LAYERS x LATENCY;
- engine RSS: idle after start, and the peak sampled every 20 ms during the deploy;
- destroy time: `trellis destroy` of the deployed instance (the same critical path, dependents
  first), with the engine's peak RSS during it and its RSS after;
- rollback time: a second instance whose last layer holds one resource that fails its create,
  deployed with `--rollback-on-failure`: from `rollback.started` to the operation's end (the
  engine's own event timestamps), against the critical path of undoing it (LAYERS layers of
  destroys);
- reconcile time: a third instance whose engine is killed (SIGKILL) half way through its
  deploy and restarted; `trellis reconcile --mode reapply` settles the calls left in flight.

State: `--state sqlite` (the default) keeps it in `state.db` in each run's fresh data directory.
`--state postgres://USER@HOST:PORT/DB` gives each run a fresh database instead: the script
creates `trellis_bench_<random>` through `psql` connected to the given URL's database
(`CREATE DATABASE`), starts every engine of the run with `--state` pointing at it (the restart of
the reconcile phase reuses it, as it reuses the data directory), and drops it after the run
(`DROP DATABASE ... WITH (FORCE)`, PostgreSQL 13 or later). The password, if any, goes in
PGPASSWORD, not the URL. With PostgreSQL, the deploy table also gives the CPU seconds the
database server's backends serving that database used during the deploy ("store CPU").

Usage: python3 bench/deploy.py [--resources 1000 10000] [--layers 10] [--latency-ms 200]
                               [--state sqlite|postgres://root@127.0.0.1:5432/test]
                               [--skip-rollback] [--skip-reconcile]
Build first: cargo build --release --workspace
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# TRELLIS_BENCH_BIN: a directory holding copies of the binaries (so a rebuild in target/ cannot
# change them mid-run).
BIN = os.environ.get("TRELLIS_BENCH_BIN") or os.path.join(ROOT, "target", "release")


def blueprint(n, layers, latency, failing=False):
    """With `failing`, the last layer's first resource fails its create (no retries)."""
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
            if failing and k == layers - 1 and j == 0:
                out.append("      failOn: create")
                out.append("      failClass: badInput")
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


def psql(url, sql):
    """Runs `sql` through `psql` connected to `url`; its output (unaligned, tuples only)."""
    out = subprocess.run(["psql", url, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                          "-c", sql], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"psql failed: {out.stderr.strip()}")
    return out.stdout


class Database:
    """A fresh PostgreSQL database for one run, made next to the one `admin_url` names."""

    def __init__(self, admin_url):
        self.admin_url = admin_url
        self.name = f"trellis_bench_{uuid.uuid4().hex[:12]}"
        psql(admin_url, f"CREATE DATABASE {self.name}")
        u = urllib.parse.urlsplit(admin_url)
        self.url = urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + self.name, u.query, ""))

    def backends(self):
        """The server processes serving this database (the engine's connections)."""
        out = psql(self.admin_url, "SELECT pid FROM pg_stat_activity "
                                   f"WHERE datname = '{self.name}'")
        return [int(p) for p in out.split()]

    def cpu_s(self):
        return sum(cpu_s(p) for p in self.backends())

    def drop(self):
        psql(self.admin_url, f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


class Engine:
    """A `trellis serve` on a free port with its data in `work/data`, and its state there
    (`state` None) or at the PostgreSQL URL `state`."""

    def __init__(self, work, parallel, state=None):
        self.work = work
        cmd = [os.path.join(BIN, "trellis"), "serve", "--listen", "127.0.0.1:0",
               "--data-dir", os.path.join(work, "data"), "--max-parallel", str(parallel),
               "--log-level", "warn"]
        if state:
            cmd += ["--state", state]
        self.proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (\S+)", line)
        if not m:
            raise SystemExit(f"engine did not start: {line!r}")
        self.addr = m.group(1)
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        time.sleep(0.5)

    @property
    def pid(self):
        return self.proc.pid

    def cli(self, *args, ok=(0,)):
        t = time.perf_counter()
        out = subprocess.run([os.path.join(BIN, "trellis"), *args, "--engine", self.addr,
                              "--format", "json"], cwd=self.work, capture_output=True, text=True)
        dt = time.perf_counter() - t
        if out.returncode not in ok:
            raise SystemExit(f"{args[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
        return dt, out.stdout

    def events(self, instance):
        _, out = self.cli("events", "--instance", instance)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=60)


class Peak:
    """The peak RSS of `pid`, sampled every 20 ms while in a `with` block."""

    def __init__(self, pid):
        self.pid, self.kib, self.done = pid, 0, threading.Event()

    def __enter__(self):
        def sample():
            while not self.done.is_set():
                self.kib = max(self.kib, rss_kib(self.pid))
                time.sleep(0.02)
        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def event_time(e):
    """Seconds since the epoch of an event's `at` (RFC 3339, milliseconds)."""
    from datetime import datetime
    return datetime.fromisoformat(e["at"].replace("Z", "+00:00")).timestamp()


def run(n, layers, latency, parallel, rollback=True, reconcile=True, state="sqlite"):
    work = tempfile.mkdtemp(prefix="trellis-bench-")
    db = None if state == "sqlite" else Database(state)
    url = db.url if db else None
    engine = None
    try:
        with open(os.path.join(work, "bench.yaml"), "w") as f:
            f.write(blueprint(n, layers, latency))
        with open(os.path.join(work, "failing.yaml"), "w") as f:
            f.write(blueprint(n, layers, latency, failing=True))
        engine = Engine(work, parallel, url)
        idle = rss_kib(engine.pid)
        plan_s, out = engine.cli("plan", "bench.yaml", "--instance", "bench")
        cs = re.search(r'"id":\s*"(cs_[0-9a-f]+)"', out).group(1)

        plugins = children(engine.pid)
        cpu0 = cpu_s(engine.pid), sum(cpu_s(p) for p in plugins), db.cpu_s() if db else 0.0
        with Peak(engine.pid) as deploy_peak:
            deploy_s, _ = engine.cli("deploy", "--change-set", cs)
        cpu1 = cpu_s(engine.pid), sum(cpu_s(p) for p in plugins), db.cpu_s() if db else 0.0
        with Peak(engine.pid) as destroy_peak:
            destroy_s, _ = engine.cli("destroy", "--instance", "bench")
        after_destroy = rss_kib(engine.pid)
        critical = layers * latency / 1000
        # With --latency-ms 0 there is no critical path to compare with: no ratios.
        per = (lambda s: s / critical) if critical else (lambda s: None)
        r = {
            "resources": n, "layers": layers, "latency_ms": latency, "parallel": parallel,
            "plan_s": plan_s, "deploy_s": deploy_s, "ratio": per(deploy_s),
            "rss_idle_mib": idle / 1024, "rss_peak_mib": deploy_peak.kib / 1024,
            "engine_cpu_s": cpu1[0] - cpu0[0], "plugin_cpu_s": cpu1[1] - cpu0[1],
            "store_cpu_s": cpu1[2] - cpu0[2] if db else None,
            "destroy_s": destroy_s, "destroy_ratio": per(destroy_s),
            "destroy_peak_mib": destroy_peak.kib / 1024, "after_destroy_mib": after_destroy / 1024,
        }
        if rollback:
            # Every resource but the failing one is created (its layer's calls are in flight
            # together), then undone in reverse: LAYERS latencies on the critical path.
            engine.cli("deploy", "failing.yaml", "--instance", "rb", "--rollback-on-failure",
                       ok=(1,))
            events = engine.events("rb")
            started = next(event_time(e) for e in events if e["kind"] == "rollback.started")
            ended = next(event_time(e) for e in reversed(events)
                         if e["kind"] == "operation.finished")
            undone = sum(1 for e in events if e["kind"] == "resource.destroyed")
            r["rollback_s"] = ended - started
            r["rollback_ratio"] = per(r["rollback_s"])
            r["rolled_back"] = undone
        engine.stop()
        if reconcile:
            # Killed half way through its deploy: the calls in flight stay intents.
            engine = Engine(work, parallel, url)
            _, out = engine.cli("plan", "bench.yaml", "--instance", "rc")
            cs = re.search(r'"id":\s*"(cs_[0-9a-f]+)"', out).group(1)
            deploy = subprocess.Popen(
                [os.path.join(BIN, "trellis"), "deploy", "--change-set", cs, "--engine",
                 engine.addr, "--format", "json"], cwd=work,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep((critical or deploy_s) / 2)
            engine.kill()
            deploy.wait(timeout=60)
            engine = Engine(work, parallel, url)
            reconcile_s, out = engine.cli("reconcile", "--instance", "rc", "--mode", "reapply")
            op = json.loads(out)["operation"]["id"]
            settled = sum(1 for e in engine.events("rc")
                          if e["payload"].get("operation") == op
                          and e["kind"] in ("resource.created", "resource.destroyed"))
            r["reconcile_s"] = reconcile_s
            r["reconciled"] = settled
            engine.stop()
        engine = None
        return r
    finally:
        if engine is not None and engine.proc.poll() is None:
            engine.kill()
        if db:
            db.drop()
        if os.environ.get("TRELLIS_BENCH_KEEP"):
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def ratio(x):
    return "—" if x is None else f"{x:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resources", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--latency-ms", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=0,
                    help="--max-parallel of the engine (default: the layer width)")
    ap.add_argument("--skip-rollback", action="store_true")
    ap.add_argument("--skip-reconcile", action="store_true")
    ap.add_argument("--state", default="sqlite",
                    help="sqlite (default), or a PostgreSQL URL (postgres://USER@HOST:PORT/DB) "
                         "next to which each run gets a fresh database")
    args = ap.parse_args()
    if not (args.state == "sqlite" or args.state.startswith(("postgres://", "postgresql://"))):
        raise SystemExit("--state: sqlite or a postgres:// URL")
    if not os.path.exists(os.path.join(BIN, "trellis-provider-sim")):
        raise SystemExit("build first: cargo build --release --workspace")
    pg = args.state != "sqlite"
    print(f"state: {'PostgreSQL' if pg else 'SQLite'}")
    print("| resources | layers x latency | parallel | plan | deploy | deploy / critical path "
          "| RSS idle | RSS peak | engine CPU | plugin CPU |" + (" store CPU |" if pg else ""))
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
          + (" ---: |" if pg else ""))
    results = []
    for n in args.resources:
        parallel = args.parallel or max(1, n // args.layers)
        r = run(n, args.layers, args.latency_ms, parallel,
                rollback=not args.skip_rollback, reconcile=not args.skip_reconcile,
                state=args.state)
        results.append(r)
        print(f"| {n:,} | {args.layers} x {args.latency_ms} ms | {parallel} | {r['plan_s']:.2f} s "
              f"| {r['deploy_s']:.2f} s | {ratio(r['ratio'])} | {r['rss_idle_mib']:.0f} MiB "
              f"| {r['rss_peak_mib']:.0f} MiB | {r['engine_cpu_s']:.2f} s "
              f"| {r['plugin_cpu_s']:.2f} s |"
              + (f" {r['store_cpu_s']:.2f} s |" if pg else ""), flush=True)
    print()
    print("| resources | destroy | destroy / critical path | RSS peak | RSS after "
          "| rollback (undone) | rollback / critical path | reconcile (settled) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        rb = (f"{r['rollback_s']:.2f} s ({r['rolled_back']:,}) | {ratio(r['rollback_ratio'])}"
              if "rollback_s" in r else "— | —")
        rc = (f"{r['reconcile_s']:.2f} s ({r['reconciled']:,})" if "reconcile_s" in r else "—")
        print(f"| {r['resources']:,} | {r['destroy_s']:.2f} s | {ratio(r['destroy_ratio'])} "
              f"| {r['destroy_peak_mib']:.0f} MiB | {r['after_destroy_mib']:.0f} MiB | {rb} | {rc} |",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())

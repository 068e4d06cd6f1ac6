#!/usr/bin/env python3
"""Where a deploy's and a destroy's time goes, from the engine's own event timestamps.

Deploys then destroys the bench/deploy.py blueprint (RESOURCES sim resources in LAYERS layers
of LATENCY ms) on a fresh `trellis serve`, and prints for each: the CLI's wall time, the time
from the CLI's start to the operation's first event, from it to the first intent (the state
read and the first unit of work), from the first to the last event, and for
every layer when its first and its last resource finished (seconds after the first event) and
how much longer than LATENCY its calls took, from intent to outcome (median and maximum: where
a layer's spread comes from); for the destroy also the CPU the engine, its plugin processes and
the watching CLI used.

With --no-watch the destroy is started over the engine API (Python grpcio, stubs generated
from proto/ into a temporary directory; `pip install grpcio-tools`) and polled with
GetOperation instead of watched by the CLI: the difference is what serving the event stream
costs.

Usage: python3 bench/timeline.py [--resources 10000] [--layers 10] [--latency-ms 200] [--runs 1]
                                 [--no-watch]
Build first: cargo build --release --workspace (TRELLIS_BENCH_BIN as for bench/deploy.py)
"""

import argparse
import collections
import importlib.util
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("deploy_bench", os.path.join(HERE, "deploy.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def report(name, events, kind, start, end, latency_ms):
    """`events` of the instance; the operation is the one whose events include `kind`."""
    ops = {e.get("operationId") for e in events if e["kind"] == kind}
    window = [e for e in events if e.get("operationId") in ops]
    first, last = bench.event_time(window[0]), bench.event_time(window[-1])
    intent = min(bench.event_time(e) for e in window if e["kind"].endswith("_requested"))
    print(f"{name}: wall {end - start:.3f} s; start to first event {first - start:.3f} s, "
          f"first event to first intent {intent - first:.3f} s, "
          f"first to last event {last - first:.3f} s, last event to CLI exit {end - last:.3f} s")
    layers = collections.defaultdict(list)
    requested, excess = {}, collections.defaultdict(list)
    for e in window:
        resource = (e.get("payload") or {}).get("resource")
        if not resource:
            continue
        layer = resource.split("_")[0]
        if e["kind"].endswith("_requested"):
            requested[resource] = bench.event_time(e)
        elif e["kind"] in ("resource.created", "resource.destroyed"):
            layers[layer].append(bench.event_time(e) - first)
            if resource in requested:
                excess[layer].append(bench.event_time(e) - requested[resource] - latency_ms / 1e3)
    for layer in sorted(layers, key=lambda k: min(layers[k])):
        t, x = layers[layer], sorted(excess[layer])
        calls = (f"; calls +{x[len(x) // 2] * 1e3:.0f} ms median, +{x[-1] * 1e3:.0f} ms max"
                 if x else "")
        print(f"  {layer}: first {min(t):.3f} s, last {max(t):.3f} s, "
              f"spread {max(t) - min(t):.3f} s{calls}")


def engine_stubs():
    """The engine API's Python stubs, generated from proto/ into a temporary directory."""
    out = tempfile.mkdtemp(prefix="trellis-stubs-")
    protos = ["trellis/engine/v1/engine.proto", "trellis/plugin/v1/types.proto"]
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={out}",
                    f"--grpc_python_out={out}", *protos],
                   cwd=os.path.join(os.path.dirname(HERE), "proto"), check=True)
    for d in ["trellis", "trellis/engine", "trellis/engine/v1", "trellis/plugin",
              "trellis/plugin/v1"]:
        open(os.path.join(out, d, "__init__.py"), "a").close()
    sys.path.insert(0, out)
    import grpc
    from trellis.engine.v1 import engine_pb2, engine_pb2_grpc
    return grpc, engine_pb2, engine_pb2_grpc


def destroy_unwatched(stubs, addr):
    """Starts the destroy over the API and polls its operation until it ends."""
    grpc, pb, rpc = stubs
    api = rpc.EngineStub(grpc.insecure_channel(addr.removeprefix("http://")))
    op = api.Destroy(pb.DestroyRequest(request_id=f"timeline-{time.time_ns()}", instance="bench"))
    running = (pb.OPERATION_STATUS_PENDING, pb.OPERATION_STATUS_RUNNING)
    while api.GetOperation(pb.GetOperationRequest(operation_id=op.id)).status in running:
        time.sleep(0.005)


def thread_cpu(pid):
    """{tid: (name, CPU seconds)} of a process's threads."""
    out = {}
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                name = f.read().strip()
            out[int(t)] = (name, bench.cpu_s(f"{pid}/task/{t}"))
    except OSError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resources", type=int, default=10000)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--latency-ms", type=int, default=200)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--no-watch", action="store_true")
    ap.add_argument("--threads", action="store_true",
                    help="also print the engine's busiest threads during the destroy")
    a = ap.parse_args()
    stubs = engine_stubs() if a.no_watch else None
    for _ in range(a.runs):
        work = tempfile.mkdtemp(prefix="trellis-timeline-")
        try:
            with open(os.path.join(work, "bench.yaml"), "w") as f:
                f.write(bench.blueprint(a.resources, a.layers, a.latency_ms))
            engine = bench.Engine(work, a.resources // a.layers)
            _, out = engine.cli("plan", "bench.yaml", "--instance", "bench")
            cs = re.search(r'"id":\s*"(cs_[0-9a-f]+)"', out).group(1)
            t0 = time.time()
            engine.cli("deploy", "--change-set", cs)
            plugins = bench.children(engine.pid)
            cpu = [bench.cpu_s(p) for p in [engine.pid, *plugins]]
            threads0 = thread_cpu(engine.pid)
            # The CLI is the only child this script reaps during the destroy.
            cli0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t1 = time.time()
            if stubs:
                destroy_unwatched(stubs, engine.addr)
            else:
                engine.cli("destroy", "--instance", "bench")
            t2 = time.time()
            cli1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cli = (cli1.ru_utime + cli1.ru_stime) - (cli0.ru_utime + cli0.ru_stime)
            cpu = [bench.cpu_s(p) - c for p, c in zip([engine.pid, *plugins], cpu)]
            threads = thread_cpu(engine.pid)
            events = engine.events("bench")
            report("deploy", events, "resource.created", t0, t1, a.latency_ms)
            report("destroy", events, "resource.destroyed", t1, t2, a.latency_ms)
            print(f"  CPU during the destroy: engine {cpu[0]:.2f} s, plugins {sum(cpu[1:]):.2f} s, "
                  f"CLI {cli:.2f} s")
            if a.threads:
                busy = sorted(((c - threads0.get(t, (n, 0.0))[1], n, t)
                               for t, (n, c) in threads.items()), reverse=True)
                print("  engine threads: " + ", ".join(
                    f"{n}[{t}] {c:.2f} s" for c, n, t in busy[:8] if c > 0.005))
            engine.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

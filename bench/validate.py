#!/usr/bin/env python3
"""Validation benchmark: whole-process `trellis validate` against Python loaders.

usage: python3 bench/validate.py [--runs N] [--binary PATH]

Generates blueprints of 1,000 and 10,000 resources (bench/gen_blueprint.py) in
YAML and JSON under bench/out/, then times:
  - PyYAML's C loader, `yaml.load(f, Loader=yaml.CSafeLoader)`, inside Python
    around the call only (the baseline the YAML target is stated against);
  - Python's `json.load`, likewise;
  - `trellis validate FILE` as a whole process (start-up, read, parse,
    validate, print), from fork to exit;
  - `trellis eval --blueprint FILE '${values.prefix}'`, which validates and
    then evaluates every value and resource (the cost evaluation adds).
Each figure is the median of N runs (default 7). Prints a Markdown table.
Build the binary first: cargo build --release -p trellis
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gen_blueprint  # noqa: E402


def median_time(fn, runs):
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "trellis"))
    args = ap.parse_args()
    try:
        import yaml
        loader = yaml.CSafeLoader
    except (ImportError, AttributeError):
        sys.exit("PyYAML with libyaml is needed: pip install pyyaml")
    if not os.path.exists(args.binary):
        sys.exit("build first: cargo build --release -p trellis")

    out = os.path.join(HERE, "out")
    os.makedirs(out, exist_ok=True)
    rows = []
    for n in (1000, 10000):
        doc = gen_blueprint.blueprint(n)
        for fmt in ("yaml", "json"):
            path = os.path.join(out, "bp-%d.%s" % (n, fmt))
            with open(path, "w") as f:
                f.write(gen_blueprint.to_yaml(doc) if fmt == "yaml" else json.dumps(doc, indent=2))
            size = os.path.getsize(path)

            def py_load(path=path, fmt=fmt):
                with open(path) as f:
                    if fmt == "yaml":
                        t = time.perf_counter()
                        yaml.load(f, Loader=loader)
                    else:
                        t = time.perf_counter()
                        json.load(f)
                    return time.perf_counter() - t

            py = statistics.median(py_load() for _ in range(args.runs))

            def run(path=path):
                r = subprocess.run([args.binary, "validate", path], stdout=subprocess.DEVNULL)
                if r.returncode != 0:
                    sys.exit("trellis validate %s failed (exit %d)" % (path, r.returncode))

            tr = median_time(run, args.runs)

            def run_eval(path=path):
                # Evaluates every value and every resource (each expanded,
                # conditions applied) before printing one value.
                r = subprocess.run([args.binary, "eval", "--blueprint", path, "${values.prefix}"],
                                   stdout=subprocess.DEVNULL)
                if r.returncode != 0:
                    sys.exit("trellis eval on %s failed (exit %d)" % (path, r.returncode))

            ev = median_time(run_eval, args.runs)
            baseline = "yaml.CSafeLoader" if fmt == "yaml" else "json.load"
            rows.append((n, fmt, size, baseline, py, tr, ev))

    print("machine: %s, %d cores, Python %s" % (platform.platform(), os.cpu_count(), platform.python_version()))
    print("median of %d runs\n" % args.runs)
    print("| resources | format | size | Python baseline | baseline | `trellis validate` | validate / baseline | `trellis eval --blueprint` | eval / validate |")
    print("| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for n, fmt, size, base, py, tr, ev in rows:
        print("| %d | %s | %.1f MB | %s | %.1f ms | %.1f ms | %.3f | %.1f ms | %.2f |" % (
            n, fmt, size / 1e6, base, py * 1e3, tr * 1e3, tr / py, ev * 1e3, ev / tr))


if __name__ == "__main__":
    main()

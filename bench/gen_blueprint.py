#!/usr/bin/env python3
"""Generate a large, valid blueprint for benchmarks.

usage: gen_blueprint.py N {yaml|json} > out

Each resource has labels, a link selector, a few substitutions and references to
earlier resources, so validation exercises parsing, the substitution grammar and
reference resolution, not just the YAML scanner.
"""
import json
import re
import sys

PLAIN = re.compile(r"^[A-Za-z$][A-Za-z0-9_${}().,/ -]*$")
NUMBER = re.compile(r"^-?[0-9.]+$")


def blueprint(n):
    variables = {
        "environment": {"type": "string", "default": "production",
                        "allowedValues": ["staging", "production"]},
        "region": {"type": "string", "default": "eu-west-1"},
        "replicas": {"type": "integer", "default": 3},
    }
    values = {
        "prefix": {"type": "string", "value": "app-${variables.environment}"},
    }
    resources = {}
    for i in range(n):
        spec = {
            "name": "${values.prefix}-res-%d" % i,
            "region": "${variables.region}",
            "replicas": "${variables.replicas}",
            "size": i % 17,
        }
        if i > 0:
            spec["upstream"] = "${resources.res%d.spec.name}" % (i - 1)
        if i > 10:
            spec["peerHost"] = "${to_upper(resources.res%d.spec.region)}:${res%d.spec.size}" % (i - 10, i - 7)
        resources["res%d" % i] = {
            "type": "sim/resource" if i % 2 else "local/file",
            "metadata": {
                "displayName": "Resource %d" % i,
                "labels": {"app": "bench", "group": "g%d" % (i % 10)},
                "annotations": {"bench.priority": i % 5},
            },
            "linkSelector": {"byLabel": {"group": "g%d" % ((i + 1) % 10)}},
            "spec": spec,
        }
    exports = {"first": {"type": "string", "field": "resources.res0.spec.name"}}
    return {"version": "2023-04-20", "variables": variables, "values": values,
            "resources": resources, "exports": exports}


def to_yaml(doc):
    out = []

    def scalar(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        if PLAIN.match(v) and v not in ("true", "false", "null") and not NUMBER.match(v):
            return v
        return json.dumps(v)  # a JSON string is a valid YAML double-quoted scalar

    def emit(v, indent):
        pad = "  " * indent
        if isinstance(v, dict):
            for k, x in v.items():
                if isinstance(x, (dict, list)) and x:
                    out.append("%s%s:" % (pad, k))
                    emit(x, indent + 1)
                else:
                    out.append("%s%s: %s" % (pad, k, scalar(x)))
        else:
            for x in v:
                if isinstance(x, dict):
                    first = True
                    for k, y in x.items():
                        lead = pad + ("- " if first else "  ")
                        out.append("%s%s: %s" % (lead, k, scalar(y)))
                        first = False
                else:
                    out.append("%s- %s" % (pad, scalar(x)))

    out.append("version: 2023-04-20")
    emit({k: v for k, v in doc.items() if k != "version"}, 0)
    return "\n".join(out) + "\n"


def main():
    n, fmt = int(sys.argv[1]), sys.argv[2]
    doc = blueprint(n)
    sys.stdout.write(to_yaml(doc) if fmt == "yaml" else json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()

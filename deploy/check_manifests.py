#!/usr/bin/env python3
"""Offline checks of deploy/: every YAML file parses, and the files agree with each other.

kubeconform needs its schemas from the network, which CI does not have, so the Kubernetes
manifests are checked structurally instead: the fields every object needs, the references
between objects (volumes, Secret/ConfigMap/PVC names, ports, labels), the probes, and the
values that must match the image and deploy/trellis.toml. Run by deploy/lint.sh.
"""

import pathlib
import re
import sys
import tomllib

import yaml

DEPLOY = pathlib.Path(__file__).resolve().parent
errors = []


def fail(where, message):
    errors.append(f"{where}: {message}")


def seconds(value):
    """A duration as trellis.toml or compose writes it: 60, "60s", "2m", "500ms"."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"(\d+)(ms|s|m|h)?", str(value).strip())
    if not m:
        raise ValueError(f"not a duration: {value!r}")
    n, unit = int(m.group(1)), m.group(2) or "s"
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def load_all(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except yaml.YAMLError as e:
        fail(path.relative_to(DEPLOY.parent), f"does not parse: {e}")
        return []


# --- every YAML file parses -----------------------------------------------------------------
docs_by_file = {}
for path in sorted(DEPLOY.rglob("*.y*ml")):
    docs_by_file[path] = load_all(path)

config_text = (DEPLOY / "trellis.toml").read_text(encoding="utf-8")
config = tomllib.loads(config_text)
drain = seconds(config.get("drain-timeout", config.get("drain_timeout", 30)))
port = int(config["listen"].rsplit(":", 1)[1])

dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
m = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
image_uid, image_gid = (int(m.group(1)), int(m.group(2))) if m else (None, None)
if m is None:
    fail("deploy/Dockerfile", "no numeric `USER uid:gid` line")
if "COPY deploy/trellis.toml /etc/trellis/trellis.toml" not in dockerfile:
    fail("deploy/Dockerfile", "does not install deploy/trellis.toml as /etc/trellis/trellis.toml")
if f"-addr=127.0.0.1:{port}" not in dockerfile:
    fail("deploy/Dockerfile", f"HEALTHCHECK does not probe the configured port {port}")

# --- Kubernetes -----------------------------------------------------------------------------
k8s_dir = DEPLOY / "kubernetes"
objects = {}  # (kind, name) -> object
for path, docs in docs_by_file.items():
    if path.parent != k8s_dir:
        continue
    where = path.relative_to(DEPLOY.parent)
    for doc in docs:
        if not isinstance(doc, dict):
            fail(where, "a document is not a mapping")
            continue
        kind = doc.get("kind")
        if not doc.get("apiVersion") or not kind:
            fail(where, "apiVersion and kind are required")
            continue
        if kind == "Kustomization":
            # secret.yaml is a placeholder: applying it with the rest would replace the
            # operator's tokens.
            listed = set(doc.get("resources", []))
            present = {p.name for p in k8s_dir.glob("*.yaml")} - {path.name, "secret.yaml"}
            if listed != present:
                fail(where, f"resources {sorted(listed)} are not the manifests {sorted(present)}")
            continue
        name = (doc.get("metadata") or {}).get("name")
        if not name:
            fail(where, f"{kind}: metadata.name is required")
            continue
        objects[(kind, name)] = (where, doc)

deployments = [(w, d) for (k, _), (w, d) in objects.items() if k == "Deployment"]
if len(deployments) != 1:
    fail("deploy/kubernetes", f"expected one Deployment, found {len(deployments)}")
for where, dep in deployments:
    spec = dep.get("spec", {})
    template = spec.get("template", {})
    labels = template.get("metadata", {}).get("labels", {})
    selector = spec.get("selector", {}).get("matchLabels", {})
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        fail(where, "spec.selector.matchLabels does not select the pod template's labels")
    if spec.get("replicas", 1) != 1 or spec.get("strategy", {}).get("type") != "Recreate":
        fail(where, "SQLite state: replicas must be 1 with strategy Recreate")
    pod = template.get("spec", {})
    if pod.get("terminationGracePeriodSeconds", 30) <= drain:
        fail(where, f"terminationGracePeriodSeconds must exceed drain-timeout ({drain}s)")
    psc = pod.get("securityContext", {})
    if not psc.get("runAsNonRoot"):
        fail(where, "securityContext.runAsNonRoot must be true")
    if (psc.get("runAsUser"), psc.get("runAsGroup")) != (image_uid, image_gid):
        fail(where, f"runAsUser/runAsGroup must be the image's {image_uid}:{image_gid}")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for v in volumes.values():
        refs = []
        if "configMap" in v:
            refs.append(("ConfigMap", v["configMap"]["name"], v["configMap"].get("items", [])))
        if "secret" in v:
            refs.append(("Secret", v["secret"]["secretName"], v["secret"].get("items", [])))
        if "persistentVolumeClaim" in v:
            refs.append(("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"], []))
        for source in v.get("projected", {}).get("sources", []):
            for kind in ("configMap", "secret"):
                if kind in source:
                    refs.append((kind[0].upper() + kind[1:], source[kind]["name"],
                                 source[kind].get("items", [])))
        for kind, name, items in refs:
            target = objects.get((kind, name))
            if target is None:
                fail(where, f"volume {v['name']} names {kind} {name}, which no manifest defines")
                continue
            data = {**target[1].get("data", {}), **target[1].get("stringData", {})}
            for item in items:
                if item["key"] not in data:
                    fail(where, f"volume {v['name']}: {kind} {name} has no key {item['key']}")
    for c in pod.get("containers", []):
        cname = f"container {c.get('name')}"
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        if port not in ports.values():
            fail(where, f"{cname} does not expose the configured port {port}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(probe)
            if not p:
                fail(where, f"{cname} has no {probe}")
            elif p.get("grpc", {}).get("port") != port and "exec" not in p:
                fail(where, f"{cname} {probe} is not a gRPC health check on port {port}")
        for mount in c.get("volumeMounts", []):
            if mount["name"] not in volumes:
                fail(where, f"{cname} mounts undeclared volume {mount['name']}")
        csc = c.get("securityContext", {})
        if csc.get("allowPrivilegeEscalation") is not False:
            fail(where, f"{cname}: allowPrivilegeEscalation must be false")

for (kind, name), (where, svc) in objects.items():
    if kind != "Service":
        continue
    selector = svc.get("spec", {}).get("selector", {})
    pod_labels = [d["spec"]["template"]["metadata"].get("labels", {}) for _, d in deployments]
    if not any(all(l.get(k) == v for k, v in selector.items()) for l in pod_labels):
        fail(where, f"Service {name} selects no pod of the Deployment")
    for p in svc.get("spec", {}).get("ports", []):
        if p.get("port") != port:
            fail(where, f"Service {name} port {p.get('port')} is not the engine's {port}")

cm = objects.get(("ConfigMap", "trellis-config"))
if cm is None or cm[1].get("data", {}).get("trellis.toml") != config_text:
    fail("deploy/kubernetes/configmap.yaml", "data.trellis.toml must be deploy/trellis.toml verbatim")
secret = objects.get(("Secret", "trellis-tokens"))
if secret is not None:
    try:
        tomllib.loads(secret[1].get("stringData", {}).get("tokens.toml", ""))
    except tomllib.TOMLDecodeError as e:
        fail(secret[0], f"stringData.tokens.toml is not TOML: {e}")

# --- compose --------------------------------------------------------------------------------
compose_path = DEPLOY / "compose.yaml"
compose = (docs_by_file.get(compose_path) or [{}])[0]
where = "deploy/compose.yaml"
for sname, service in (compose.get("services") or {}).items():
    build = service.get("build", {})
    if build and not (compose_path.parent / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).is_file():
        fail(where, f"service {sname}: build.dockerfile does not exist")
    for vol in service.get("volumes", []):
        source = vol.split(":", 1)[0] if isinstance(vol, str) else vol.get("source")
        if not source.startswith((".", "/")) and source not in (compose.get("volumes") or {}):
            fail(where, f"service {sname}: volume {source} is not declared")
    for s in service.get("secrets", []):
        source = s if isinstance(s, str) else s.get("source")
        if source not in (compose.get("secrets") or {}):
            fail(where, f"service {sname}: secret {source} is not declared")
    if seconds(service.get("stop_grace_period", "10s")) <= drain:
        fail(where, f"service {sname}: stop_grace_period must exceed drain-timeout ({drain}s)")
    if not any(f":{port}" in str(p) for p in service.get("ports", [])):
        fail(where, f"service {sname} does not publish the configured port {port}")

# --- systemd --------------------------------------------------------------------------------
unit = (DEPLOY / "systemd" / "trellis.service").read_text(encoding="utf-8")
m = re.search(r"^TimeoutStopSec=(\S+)$", unit, re.M)
if not m or seconds(m.group(1)) <= drain:
    fail("deploy/systemd/trellis.service", f"TimeoutStopSec must exceed drain-timeout ({drain}s)")
if not re.search(r"^KillMode=mixed$", unit, re.M):
    fail("deploy/systemd/trellis.service", "KillMode=mixed: SIGTERM must reach the engine alone")

for e in errors:
    print(f"error: {e}", file=sys.stderr)
print(f"manifests: {len(docs_by_file)} YAML files parse, {len(objects)} Kubernetes objects, "
      f"{len(errors)} problems")
sys.exit(1 if errors else 0)

#!/usr/bin/env python3
"""Offline checks of deploy/: every YAML file parses, and the files agree with each other.

kubeconform needs its schemas from the network, which CI does not have, so the Kubernetes
manifests are checked structurally instead. Each kustomization is built the way kustomize
would (resources, strategic merge patches; anything else it holds is refused, so nothing goes
unchecked), and each variant (deploy/kubernetes: one engine on SQLite, deploy/kubernetes/
replicas: several on PostgreSQL) is checked: the fields every object needs, the references
between objects (volumes, env, Secret/ConfigMap/PVC names and keys, ports, labels), the
probes, the environment variables the engine reads, the state store's needs (one replica and
a volume for SQLite; a database URL, a password file and a replica name per pod for
PostgreSQL), and the values that must match the image and deploy/trellis.toml. With kubectl
(or kustomize) on PATH, each variant is also rendered by it and must equal this script's
build. The compose files get the same cross-checks.

    python3 deploy/check_manifests.py [--engine target/debug/trellis]
    python3 deploy/check_manifests.py --self-test

--engine also asks that binary (`trellis serve --help`) which variables it reads.
--self-test makes each mistake of MISTAKES in a copy of deploy/ and expects it caught. Both
are run by deploy/lint.sh.
"""

import copy
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.parse

import yaml

DEPLOY = pathlib.Path(__file__).resolve().parent
ROOT = DEPLOY.parent
# Where `trellis serve` declares its settings: every `env = "TRELLIS_..."` there is a
# variable the engine reads.
SERVE_CONFIG = ROOT / "server" / "trellis" / "src" / "serve" / "config.rs"
errors = []


def fail(where, message):
    errors.append(f"{where}: {message}")


def rel(path):
    return str(pathlib.Path(path).relative_to(ROOT))


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
        fail(rel(path), f"does not parse: {e}")
        return []


# Mistakes the checks must catch (--self-test): (file under the repository, text, replaced
# by, a part of the error expected). Each is made in a copy of deploy/ in a temporary
# directory, which must then fail with that error.
MISTAKES = [
    ("deploy/kubernetes/replicas/deployment-patch.yaml", "secretName: trellis-db-password",
     "secretName: trellis-db-pasword", "names Secret trellis-db-pasword, which no manifest"),
    ("deploy/kubernetes/replicas/state.yaml", "  url: postgres", "  uri: postgres",
     "ConfigMap trellis-state has no key url"),
    ("deploy/kubernetes/replicas/deployment-patch.yaml", "name: TRELLIS_REPLICA_NAME",
     "name: TRELLIS_REPLICA", "TRELLIS_REPLICA is not one the engine reads"),
    ("deploy/kubernetes/replicas/deployment-patch.yaml", "value: /run/secrets/trellis-db/password",
     "value: /run/secrets/trellis-db/pw", "is not a file of a mounted Secret"),
    ("deploy/kubernetes/replicas/deployment-patch.yaml", "fieldPath: metadata.name",
     "fieldPath: metadata.namespace", "TRELLIS_REPLICA_NAME must come from the pod's name"),
    ("deploy/kubernetes/replicas/deployment-patch.yaml", "      maxUnavailable: 0",
     "      maxUnavailable: 1", "maxUnavailable must be 0"),
    ("deploy/kubernetes/replicas/deployment-patch.yaml", "persistentVolumeClaim: null",
     "persistentVolumeClaim: {claimName: trellis-data}", "not a shared claim"),
    ("deploy/kubernetes/replicas/kustomization.yaml", "  - pdb.yaml", "  - pdb.yaml\n  - secret.yaml",
     "lists secret.yaml"),
    ("deploy/kubernetes/replicas/kustomization.yaml", "  - path: no-pvc.yaml",
     "  - path: no-claim.yaml", "patch no-claim.yaml does not exist"),
    ("deploy/kubernetes/replicas/kustomization.yaml", "  - ../base", "  - ..",
     "refuses a base that contains the overlay"),
    ("deploy/kubernetes/base/secret.yaml", "  tokens.toml: |", "  tokens: |",
     "has no key tokens.toml"),
    ("deploy/kubernetes/base/deployment.yaml", "  replicas: 1", "  replicas: 2",
     "replicas must be 1 with strategy Recreate"),
    ("deploy/compose.replicas.yaml", "    postgres:\n      condition", "    postgress:\n      condition",
     "depends_on postgress, which is not a service"),
    ("deploy/compose.replicas.yaml", "TRELLIS_REPLICA_NAME: engine-b", "TRELLIS_REPLICA_NAME: engine-a",
     "each needs a TRELLIS_REPLICA_NAME of its own"),
    ("deploy/compose.replicas.yaml", "- data-b:/var/lib/trellis", "- data-a:/var/lib/trellis",
     "volume data-a is the data directory of more than one engine"),
    ("deploy/compose.replicas.yaml", "    - source: db-password\n      target: /run/secrets/db-password\n  #",
     "    - source: db-pasword\n      target: /run/secrets/db-password\n  #",
     "secret db-pasword is not declared"),
    ("deploy/compose.replicas.yaml", "POSTGRES_USER: trellis", "POSTGRES_USER: admin",
     "POSTGRES_USER is 'admin'"),
    ("deploy/compose.replicas.yaml", "    healthcheck:", "    x-healthcheck:", "which has no healthcheck"),
    ("deploy/compose.replicas.yaml", '"8326:8325"', '"8325:8325"', "both publish host port 8325"),
    ("deploy/compose.replicas.yaml", "trellis@postgres:5432/trellis\n      TRELLIS_STATE_PASSWORD_FILE: /run/secrets/db-password\n      #",
     "trellis:pw@postgres:5432/trellis\n      TRELLIS_STATE_PASSWORD_FILE: /run/secrets/db-password\n      #",
     "TRELLIS_STATE holds a password"),
    ("deploy/compose.yaml", "stop_grace_period: 75s", "stop_grace_period: 60s",
     "stop_grace_period must exceed drain-timeout"),
    ("deploy/compose.yaml", "name: trellis\n", "name: [trellis\n", "does not parse"),
]


def self_test():
    """Makes each of MISTAKES in a copy and runs the checks there: each must fail with its
    error, and the unchanged copy must pass."""
    import tempfile
    script = pathlib.Path(__file__).resolve()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        shutil.copytree(DEPLOY, tmp / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
        (tmp / SERVE_CONFIG.relative_to(ROOT)).parent.mkdir(parents=True)
        shutil.copy(SERVE_CONFIG, tmp / SERVE_CONFIG.relative_to(ROOT))
        copy_script = tmp / script.relative_to(ROOT)

        def run():
            return subprocess.run([sys.executable, str(copy_script)], capture_output=True,
                                  text=True, timeout=300)

        clean = run()
        if clean.returncode != 0:
            print(f"self-test: the unchanged copy fails:\n{clean.stderr}", file=sys.stderr)
            return 1
        for file, old, new, expected in MISTAKES:
            path = tmp / file
            original = path.read_text(encoding="utf-8")
            if original.count(old) != 1:
                print(f"self-test: {file} has {original.count(old)} of {old!r}: update MISTAKES",
                      file=sys.stderr)
                failures += 1
                continue
            path.write_text(original.replace(old, new), encoding="utf-8")
            out = run()
            path.write_text(original, encoding="utf-8")
            if out.returncode == 0 or expected not in out.stderr:
                failures += 1
                print(f"self-test: {file}: {old!r} -> {new!r} was not caught as {expected!r}; "
                      f"exit {out.returncode}:\n{out.stderr}", file=sys.stderr)
    print(f"self-test: {len(MISTAKES) - failures} of {len(MISTAKES)} deliberate mistakes caught")
    return 1 if failures else 0


engine_bin = None
args = sys.argv[1:]
if args == ["--self-test"]:
    sys.exit(self_test())
if args[:1] == ["--engine"] and len(args) == 2:
    engine_bin = args[1]
elif args:
    sys.exit("usage: check_manifests.py [--engine PATH-TO-TRELLIS | --self-test]")

# --- every YAML file parses -----------------------------------------------------------------
docs_by_file = {}
for path in sorted(DEPLOY.rglob("*.y*ml")):
    docs_by_file[path] = load_all(path)

config_text = (DEPLOY / "trellis.toml").read_text(encoding="utf-8")
config = tomllib.loads(config_text)
drain = seconds(config.get("drain-timeout", config.get("drain_timeout", 30)))
port = int(config["listen"].rsplit(":", 1)[1])
data_dir = config.get("data-dir", config.get("data_dir"))
if config.get("state", "sqlite") != "sqlite":
    fail("deploy/trellis.toml", "state must stay sqlite: the PostgreSQL variants set TRELLIS_STATE")

dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
m = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
image_uid, image_gid = (int(m.group(1)), int(m.group(2))) if m else (None, None)
if m is None:
    fail("deploy/Dockerfile", "no numeric `USER uid:gid` line")
if "COPY deploy/trellis.toml /etc/trellis/trellis.toml" not in dockerfile:
    fail("deploy/Dockerfile", "does not install deploy/trellis.toml as /etc/trellis/trellis.toml")
if f"-addr=127.0.0.1:{port}" not in dockerfile:
    fail("deploy/Dockerfile", f"HEALTHCHECK does not probe the configured port {port}")

# --- the environment variables the engine reads ---------------------------------------------
engine_env = set()
if SERVE_CONFIG.is_file():
    engine_env = set(re.findall(r'\benv\s*=\s*"(TRELLIS_[A-Z0-9_]+)"',
                                SERVE_CONFIG.read_text(encoding="utf-8")))
if len(engine_env) < 10:
    fail(rel(SERVE_CONFIG), f"found {len(engine_env)} `env = \"TRELLIS_...\"` settings: "
         "has `trellis serve`'s config moved? (update SERVE_CONFIG)")
# Read by the PostgreSQL store when no password file is given (docs/serve.md).
engine_env.add("PGPASSWORD")
binary_env = None
if engine_bin:
    try:
        help_text = subprocess.run([engine_bin, "serve", "--help"], capture_output=True,
                                   text=True, timeout=60, check=True).stdout
        binary_env = set(re.findall(r"\[env: (TRELLIS_[A-Z0-9_]+)=", help_text)) | {"PGPASSWORD"}
    except (OSError, subprocess.SubprocessError) as e:
        fail(engine_bin, f"`serve --help` failed: {e}")


def check_env_name(where, name):
    """An engine container's variable: TRELLIS_* and PG* ones must be read by the engine."""
    if not name.startswith(("TRELLIS_", "PG")):
        return
    if name not in engine_env:
        fail(where, f"environment variable {name} is not one the engine reads "
             f"(no `env = \"{name}\"` in {rel(SERVE_CONFIG)})")
    elif binary_env is not None and name not in binary_env:
        fail(where, f"environment variable {name} is not in `{engine_bin} serve --help`: "
             "an engine binary older than the source?")


def check_state_url(where, url):
    """TRELLIS_STATE's value: `sqlite` or a PostgreSQL URL without a password. Returns the
    parsed URL, or None for SQLite."""
    if url == "sqlite":
        return None
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("postgres", "postgresql") or not parsed.hostname:
        fail(where, f"TRELLIS_STATE {url!r} is neither sqlite nor postgres://USER@HOST:PORT/DB")
        return None
    if parsed.password is not None:
        fail(where, "TRELLIS_STATE holds a password: use TRELLIS_STATE_PASSWORD_FILE")
    if not parsed.username or not parsed.path.strip("/"):
        fail(where, f"TRELLIS_STATE {url!r} must name the user and the database")
    return parsed


# --- Kubernetes: building each kustomization ------------------------------------------------
k8s_dir = DEPLOY / "kubernetes"
# The one file of a kustomization directory that must never be listed: a Secret with a
# placeholder in it, which applying would put in place of the operator's real one.
PLACEHOLDER = "secret.yaml"
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "patches"}


def key_of(doc):
    return (doc.get("kind"), (doc.get("metadata") or {}).get("name"))


def merge_key(items):
    """The key lists of this kind are merged by in a strategic merge patch, if any."""
    for k in ("name", "mountPath", "containerPort"):
        if items and all(isinstance(i, dict) and k in i for i in items):
            return k
    return None


def strategic_merge(base, patch):
    """What `kubectl kustomize` does with a strategic merge patch, for what these manifests
    use: maps merge, `null` removes a field, lists of named items merge by name, other lists
    are replaced."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and isinstance(out.get(k), list) and merge_key(out[k] + v):
            mk = merge_key(out[k] + v)
            merged = list(out[k])
            for item in v:
                at = next((i for i, b in enumerate(merged) if b[mk] == item[mk]), None)
                if at is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[at] = strategic_merge(merged[at], item)
            out[k] = merged
        else:
            out[k] = strategic_merge(out.get(k), v)
    return out


def build(directory, seen=()):
    """The objects a kustomization directory yields, keyed by (kind, name), each with the
    file it came from; and its placeholder Secrets (its own and its bases'), which the
    operator creates and the Deployment may therefore name."""
    where = rel(directory / "kustomization.yaml")
    objects, placeholders = {}, {}
    if directory in seen:
        fail(where, "includes itself")
        return objects, placeholders
    docs = docs_by_file.get(directory / "kustomization.yaml")
    if not docs:
        fail(rel(directory), "no kustomization.yaml")
        return objects, placeholders
    kust = docs[0]
    if kust.get("kind") != "Kustomization":
        fail(where, "kind must be Kustomization")
    for field in set(kust) - KUSTOMIZATION_FIELDS:
        fail(where, f"{field}: not understood by deploy/check_manifests.py, so not checked")

    used = {directory / "kustomization.yaml"}
    for entry in kust.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            if target in directory.parents or target == directory:
                fail(where, f"resource {entry}: kustomize refuses a base that contains "
                     "the overlay (move the base into a directory of its own)")
                continue
            sub_objects, sub_placeholders = build(target, (*seen, directory))
            placeholders.update(sub_placeholders)
            new = sub_objects.items()
        elif target.is_file():
            if target.parent != directory:
                fail(where, f"resource {entry}: a file outside the kustomization's directory "
                     "(kustomize refuses it): list its directory instead")
            if target.name == PLACEHOLDER:
                fail(where, f"lists {PLACEHOLDER}: applying it would replace the real Secret "
                     "with the placeholder")
            used.add(target)
            new = []
            for doc in docs_by_file.get(target, []):
                if not isinstance(doc, dict):
                    fail(rel(target), "a document is not a mapping")
                elif not doc.get("apiVersion") or not doc.get("kind"):
                    fail(rel(target), "apiVersion and kind are required")
                elif not key_of(doc)[1]:
                    fail(rel(target), f"{doc['kind']}: metadata.name is required")
                else:
                    new.append((key_of(doc), (rel(target), doc)))
        else:
            fail(where, f"resource {entry} does not exist")
            continue
        for k, v in new:
            if k in objects:
                fail(where, f"{k[0]} {k[1]} is defined twice ({objects[k][0]}, {v[0]})")
            objects[k] = v

    for entry in kust.get("patches", []):
        if not isinstance(entry, dict) or set(entry) != {"path"}:
            fail(where, f"patch {entry!r}: only `- path: FILE` patches are checked")
            continue
        target = directory / entry["path"]
        if not target.is_file():
            fail(where, f"patch {entry['path']} does not exist")
            continue
        used.add(target)
        for patch in docs_by_file.get(target, []):
            k = key_of(patch)
            if k not in objects:
                fail(rel(target), f"patches {k[0]} {k[1]}, which no resource defines")
            elif patch.get("$patch") == "delete":
                del objects[k]
            else:
                body = {f: v for f, v in patch.items() if f != "$patch"}
                objects[k] = (objects[k][0] + f" + {rel(target)}",
                              strategic_merge(objects[k][1], body))

    placeholder = directory / PLACEHOLDER
    if placeholder.is_file():
        used.add(placeholder)
        for doc in docs_by_file.get(placeholder, []):
            if doc.get("kind") != "Secret" or not key_of(doc)[1]:
                fail(rel(placeholder), "must hold named Secrets only")
                continue
            placeholders[key_of(doc)] = (rel(placeholder), doc)
    for path in sorted(set(directory.glob("*.y*ml")) - used):
        fail(rel(path), f"neither a resource nor a patch of {where}")
    return objects, placeholders


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_variant(name, directory, expect):
    """One kustomization, built: `expect` is "sqlite" or "postgres"."""
    objects, placeholders = build(directory)
    defined = {**objects, **placeholders}
    deployments = [(w, d) for (k, _), (w, d) in objects.items() if k == "Deployment"]
    if len(deployments) != 1:
        fail(rel(directory), f"expected one Deployment, found {len(deployments)}")
    for where, dep in deployments:
        check_deployment(where, dep, defined, expect)
    pod_labels = [d["spec"]["template"]["metadata"].get("labels", {}) for _, d in deployments]
    replicas = max([d["spec"].get("replicas", 1) for _, d in deployments] or [1])
    for (kind, oname), (where, obj) in objects.items():
        spec = obj.get("spec", {})
        if kind == "Service":
            if not any(selects(spec.get("selector", {}), l) for l in pod_labels):
                fail(where, f"Service {oname} selects no pod of the Deployment")
            for p in spec.get("ports", []):
                if p.get("port") != port:
                    fail(where, f"Service {oname} port {p.get('port')} is not the engine's {port}")
        if kind == "PodDisruptionBudget":
            if not any(selects(spec.get("selector", {}).get("matchLabels", {}), l)
                       for l in pod_labels):
                fail(where, f"PodDisruptionBudget {oname} selects no pod of the Deployment")
            if spec.get("minAvailable", 0) >= replicas:
                fail(where, f"PodDisruptionBudget {oname}: minAvailable must be below the "
                     f"{replicas} replicas, or no node can ever be drained")
    cm = objects.get(("ConfigMap", "trellis-config"))
    if cm is None or cm[1].get("data", {}).get("trellis.toml") != config_text:
        fail(cm[0] if cm else rel(directory), "ConfigMap trellis-config: data.trellis.toml must "
             "be deploy/trellis.toml verbatim")
    for (kind, _), (where, secret) in placeholders.items():
        text = secret.get("stringData", {}).get("tokens.toml")
        if text is not None:
            try:
                tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                fail(where, f"stringData.tokens.toml is not TOML: {e}")
    if expect == "postgres" and any(k == "PersistentVolumeClaim" for k, _ in objects):
        fail(rel(directory), "PostgreSQL replicas keep no state on a claim: leave the "
             "PersistentVolumeClaim out")
    render(name, directory, objects)
    return objects


def lookup(defined, where, kind, name, key=None, what=""):
    """The object a reference names, and (with key) that it has the key."""
    target = defined.get((kind, name))
    if target is None:
        fail(where, f"{what} names {kind} {name}, which no manifest defines")
        return None
    if key is not None:
        data = {**target[1].get("data", {}), **target[1].get("stringData", {})}
        if key not in data:
            fail(where, f"{what}: {kind} {name} has no key {key}")
            return None
        return data[key]
    return target


def check_deployment(where, dep, defined, expect):
    spec = dep.get("spec", {})
    template = spec.get("template", {})
    labels = template.get("metadata", {}).get("labels", {})
    if not selects(spec.get("selector", {}).get("matchLabels", {}), labels):
        fail(where, "spec.selector.matchLabels does not select the pod template's labels")
    replicas = spec.get("replicas", 1)
    strategy = spec.get("strategy", {}).get("type", "RollingUpdate")
    pod = template.get("spec", {})
    if pod.get("terminationGracePeriodSeconds", 30) <= drain:
        fail(where, f"terminationGracePeriodSeconds must exceed drain-timeout ({drain}s)")
    psc = pod.get("securityContext", {})
    if not psc.get("runAsNonRoot"):
        fail(where, "securityContext.runAsNonRoot must be true")
    if (psc.get("runAsUser"), psc.get("runAsGroup")) != (image_uid, image_gid):
        fail(where, f"runAsUser/runAsGroup must be the image's {image_uid}:{image_gid}")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    secret_files = {}  # mountPath/path -> (Secret name, key), for the password file
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
            if lookup(defined, where, kind, name, what=f"volume {v['name']}") is None:
                continue
            for item in items:
                lookup(defined, where, kind, name, item["key"], what=f"volume {v['name']}")
                if kind == "Secret":
                    secret_files[(v["name"], item["path"])] = (name, item["key"])
            if kind == "Secret" and not items:
                target = defined[(kind, name)][1]
                for key in {**target.get("data", {}), **target.get("stringData", {})}:
                    secret_files[(v["name"], key)] = (name, key)

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
        mounts = {}
        for mount in c.get("volumeMounts", []):
            if mount["name"] not in volumes:
                fail(where, f"{cname} mounts undeclared volume {mount['name']}")
            mounts[mount["mountPath"].rstrip("/")] = mount["name"]
        csc = c.get("securityContext", {})
        if csc.get("allowPrivilegeEscalation") is not False:
            fail(where, f"{cname}: allowPrivilegeEscalation must be false")

        env = {}
        for e in c.get("env", []):
            ename = e["name"]
            check_env_name(where, ename)
            if ename in env:
                fail(where, f"{cname}: {ename} is set twice")
            source = e.get("valueFrom", {})
            if "value" in e:
                env[ename] = ("value", e["value"])
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                env[ename] = ("value", lookup(defined, where, "ConfigMap", ref["name"],
                                              ref["key"], what=f"{cname} env {ename}"))
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                lookup(defined, where, "Secret", ref["name"], ref["key"],
                       what=f"{cname} env {ename}")
                env[ename] = ("secret", None)
            elif "fieldRef" in source:
                env[ename] = ("field", source["fieldRef"].get("fieldPath"))
            else:
                fail(where, f"{cname} env {ename}: no value this script understands")
        for e in c.get("envFrom", []):
            for kind in ("configMapRef", "secretRef"):
                if kind in e:
                    lookup(defined, where, "ConfigMap" if kind == "configMapRef" else "Secret",
                           e[kind]["name"], what=f"{cname} envFrom")

        data_volume = volumes.get(mounts.get(data_dir.rstrip("/")))
        if data_volume is None:
            fail(where, f"{cname}: no volume mounted at the data directory {data_dir}")
        state = env.get("TRELLIS_STATE", ("value", "sqlite"))
        url = check_state_url(f"{where}: {cname}", state[1]) if state[0] == "value" and state[1] else None
        if expect == "sqlite":
            if url is not None:
                fail(where, f"{cname}: expected SQLite state, TRELLIS_STATE is {state[1]!r}")
            if replicas != 1 or strategy != "Recreate":
                fail(where, "SQLite state: replicas must be 1 with strategy Recreate")
            if data_volume is not None and "persistentVolumeClaim" not in data_volume:
                fail(where, "SQLite state: the data directory must be a PersistentVolumeClaim")
            continue

        # PostgreSQL: several replicas, each with its own name and data directory.
        if url is None:
            fail(where, f"{cname}: TRELLIS_STATE must be a postgres:// URL "
                 "(from a ConfigMap or a value)")
        if replicas < 2:
            fail(where, f"replicas is {replicas}: this variant is for two or more")
        if strategy != "RollingUpdate":
            fail(where, "PostgreSQL replicas: strategy must be RollingUpdate")
        elif spec.get("strategy", {}).get("rollingUpdate", {}).get("maxUnavailable") != 0:
            fail(where, "rollingUpdate.maxUnavailable must be 0: start a new replica before "
                 "an old one drains")
        if data_volume is not None and "persistentVolumeClaim" in data_volume:
            fail(where, "PostgreSQL replicas: a data directory per pod (emptyDir), not a "
                 "shared claim (the engine locks its data directory)")
        if env.get("TRELLIS_REPLICA_NAME") != ("field", "metadata.name"):
            fail(where, f"{cname}: TRELLIS_REPLICA_NAME must come from the pod's name "
                 "(valueFrom.fieldRef.fieldPath: metadata.name): unique per replica")
        password = env.get("TRELLIS_STATE_PASSWORD_FILE")
        if password is None or password[0] != "value":
            fail(where, f"{cname}: TRELLIS_STATE_PASSWORD_FILE must name the mounted "
                 "password file")
        else:
            path = pathlib.PurePosixPath(password[1])
            mount = next((str(p) for p in path.parents if str(p) in mounts), None)
            found = mount and secret_files.get((mounts[mount], str(path.relative_to(mount))))
            if not found:
                fail(where, f"{cname}: TRELLIS_STATE_PASSWORD_FILE {password[1]} is not a "
                     "file of a mounted Secret")
        if "PGPASSWORD" in env and env["PGPASSWORD"][0] == "value":
            fail(where, f"{cname}: PGPASSWORD as a literal value: use the password file")


def normalise(value):
    """Order-free lists of named items, for comparing with kustomize's output."""
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [normalise(v) for v in value]
        mk = merge_key(items)
        return sorted(items, key=lambda i: str(i[mk])) if mk else items
    return value


def render(name, directory, objects):
    """The same kustomization built by kubectl (or kustomize), when one is installed."""
    if shutil.which("kustomize"):
        command = ["kustomize", "build", str(directory)]
    elif shutil.which("kubectl"):
        command = ["kubectl", "kustomize", str(directory)]
    else:
        rendered_by.append(f"{name}: not rendered (no kubectl or kustomize)")
        return
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        fail(rel(directory), f"{' '.join(command[:2])}: {e}")
        return
    if out.returncode != 0:
        fail(rel(directory), f"{' '.join(command[:2])} failed: {out.stderr.strip()}")
        return
    theirs = {key_of(d): d for d in yaml.safe_load_all(out.stdout) if d}
    ours = {k: d for k, (_, d) in objects.items()}
    if set(theirs) != set(ours):
        fail(rel(directory), f"{command[0]} builds {sorted(theirs)}, this script {sorted(ours)}")
    for k in set(theirs) & set(ours):
        if normalise(theirs[k]) != normalise(ours[k]):
            fail(rel(directory), f"{command[0]} builds {k[0]} {k[1]} differently from this "
                 "script's strategic merge")
    rendered_by.append(f"{name}: {command[0]} agrees")


rendered_by = []
all_objects = {}
variants = [("deploy/kubernetes", k8s_dir, "sqlite"),
            ("deploy/kubernetes/replicas", k8s_dir / "replicas", "postgres")]
for name, directory, expect in variants:
    for k, v in check_variant(name, directory, expect).items():
        all_objects[(name, *k)] = v
# Every kustomization is one of the variants or their bases: none left unchecked.
checked = {k8s_dir, k8s_dir / "replicas", k8s_dir / "base"}
for path in docs_by_file:
    if path.is_relative_to(k8s_dir) and path.name == "kustomization.yaml" \
            and path.parent not in checked:
        fail(rel(path), "a kustomization deploy/check_manifests.py does not check")
    if path.is_relative_to(k8s_dir) and not any(path.parent == d for d in checked):
        fail(rel(path), "outside the checked kustomization directories")


# --- compose --------------------------------------------------------------------------------
def compose_env(service):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    return {k: (None if v is None else str(v)) for k, v in env.items()}


def host_port(mapping):
    """The host side of a `ports:` entry ("8326:8325", "127.0.0.1:8326:8325"), or None."""
    if isinstance(mapping, dict):
        return mapping.get("published") and str(mapping["published"])
    parts = str(mapping).split(":")
    return parts[-2] if len(parts) >= 2 else None


def check_compose(compose_path):
    compose = (docs_by_file.get(compose_path) or [{}])[0]
    where = rel(compose_path)
    services = compose.get("services") or {}
    declared_volumes = compose.get("volumes") or {}
    declared_secrets = compose.get("secrets") or {}
    published = {}
    engines = {}  # service name -> (state URL or None, replica name, data volume)
    for sname, service in services.items():
        build = service.get("build", {})
        if build and not (compose_path.parent / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).is_file():
            fail(where, f"service {sname}: build.dockerfile does not exist")
        is_engine = build.get("dockerfile") == "deploy/Dockerfile" or \
            str(service.get("image", "")).startswith("trellis:")
        mounts = {}
        for vol in service.get("volumes", []):
            source, target = (vol.split(":")[:2] if isinstance(vol, str)
                              else (vol.get("source"), vol.get("target")))
            mounts[target.rstrip("/")] = source
            if not source.startswith((".", "/")) and source not in declared_volumes:
                fail(where, f"service {sname}: volume {source} is not declared")
        secret_targets = {}
        for s in service.get("secrets", []):
            source = s if isinstance(s, str) else s.get("source")
            target = (None if isinstance(s, str) else s.get("target")) or f"/run/secrets/{source}"
            secret_targets[target] = source
            if source not in declared_secrets:
                fail(where, f"service {sname}: secret {source} is not declared")
        depends = service.get("depends_on") or {}
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        for dep, how in depends.items():
            if dep not in services:
                fail(where, f"service {sname}: depends_on {dep}, which is not a service")
            elif (how or {}).get("condition") == "service_healthy" and \
                    "healthcheck" not in services[dep] and \
                    not str(services[dep].get("image", "")).startswith("trellis:"):
                fail(where, f"service {sname}: waits for {dep} to be healthy, which has no "
                     "healthcheck")
        for p in service.get("ports", []):
            hp = host_port(p)
            if hp and hp in published:
                fail(where, f"services {published[hp]} and {sname} both publish host port {hp}")
            published[hp] = sname
        if not is_engine:
            continue

        # An engine.
        if seconds(service.get("stop_grace_period", "10s")) <= drain:
            fail(where, f"service {sname}: stop_grace_period must exceed drain-timeout ({drain}s)")
        if not any(str(p).endswith(f":{port}") for p in service.get("ports", [])):
            fail(where, f"service {sname} does not publish the configured port {port}")
        env = compose_env(service)
        for ename in env:
            check_env_name(f"{where}: service {sname}", ename)
        url = check_state_url(f"{where}: service {sname}", env.get("TRELLIS_STATE") or "sqlite")
        engines[sname] = (url and url.geturl(), env.get("TRELLIS_REPLICA_NAME"),
                          mounts.get(data_dir.rstrip("/")))
        if mounts.get(data_dir.rstrip("/")) is None:
            fail(where, f"service {sname}: no volume at the data directory {data_dir}")
        if url is None:
            continue
        password_file = env.get("TRELLIS_STATE_PASSWORD_FILE")
        if password_file not in secret_targets:
            fail(where, f"service {sname}: TRELLIS_STATE_PASSWORD_FILE {password_file} is not "
                 "the target of one of its secrets")
        db = services.get(url.hostname)
        if db is None:
            continue  # a database outside this file
        if (depends.get(url.hostname) or {}).get("condition") != "service_healthy":
            fail(where, f"service {sname}: must depend on {url.hostname} with condition "
                 "service_healthy")
        db_env = compose_env(db)
        for key, expected in (("POSTGRES_USER", url.username),
                              ("POSTGRES_DB", url.path.strip("/"))):
            if db_env.get(key, "postgres") != expected:
                fail(where, f"service {url.hostname}: {key} is {db_env.get(key)!r}, "
                     f"TRELLIS_STATE of {sname} says {expected!r}")
        db_secrets = {(s if isinstance(s, str) else s.get("target")) or f"/run/secrets/{s.get('source')}":
                      (s if isinstance(s, str) else s.get("source")) for s in db.get("secrets", [])}
        db_password = db_secrets.get(db_env.get("POSTGRES_PASSWORD_FILE"))
        if db_password is None or db_password != secret_targets.get(password_file):
            fail(where, f"service {url.hostname}: POSTGRES_PASSWORD_FILE is not the secret "
                 f"{secret_targets.get(password_file)} that {sname} reads its password from")

    sqlite = [s for s, (u, _, _) in engines.items() if u is None]
    if len(sqlite) > 1:
        fail(where, f"services {sqlite}: more than one engine on SQLite state")
    by_state = {}
    for sname, (u, replica, _) in engines.items():
        if u is not None:
            by_state.setdefault(u, []).append((sname, replica))
    for u, replicas in by_state.items():
        names = [r for _, r in replicas]
        if len(replicas) > 1 and (None in names or len(set(names)) != len(names)):
            fail(where, f"services {[s for s, _ in replicas]} share {u}: each needs a "
                 "TRELLIS_REPLICA_NAME of its own")
    volumes = [v for _, _, v in engines.values() if v]
    for v in set(volumes):
        if volumes.count(v) > 1:
            fail(where, f"volume {v} is the data directory of more than one engine")
    return len(engines)


compose_files = sorted(DEPLOY.glob("compose*.yaml"))
engine_services = sum(check_compose(p) for p in compose_files)

# --- systemd --------------------------------------------------------------------------------
unit = (DEPLOY / "systemd" / "trellis.service").read_text(encoding="utf-8")
m = re.search(r"^TimeoutStopSec=(\S+)$", unit, re.M)
if not m or seconds(m.group(1)) <= drain:
    fail("deploy/systemd/trellis.service", f"TimeoutStopSec must exceed drain-timeout ({drain}s)")
if not re.search(r"^KillMode=mixed$", unit, re.M):
    fail("deploy/systemd/trellis.service", "KillMode=mixed: SIGTERM must reach the engine alone")

errors = list(dict.fromkeys(errors))  # a base built by two variants reports once
for e in errors:
    print(f"error: {e}", file=sys.stderr)
print(f"manifests: {len(docs_by_file)} YAML files parse; {len(variants)} Kubernetes variants, "
      f"{len(all_objects)} objects ({'; '.join(rendered_by)}); {len(compose_files)} compose "
      f"files, {engine_services} engine services; {len(engine_env)} engine variables"
      f"{' (checked against the binary too)' if binary_env is not None else ''}; "
      f"{len(errors)} problems")
sys.exit(1 if errors else 0)

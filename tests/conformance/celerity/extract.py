#!/usr/bin/env python3
"""Writes the celerity conformance cases from the Celerity documentation's YAML examples.

    python3 tests/conformance/celerity/extract.py [SPEC_DIR]

SPEC_DIR defaults to ../shared/spec/celerity (next to this checkout). For every ```yaml block
of the in-scope types' .mdx files, one case directory `<type>-<NN>[<letter>]/` is (re)written
here with:

- `blueprint.yaml`: the example, headed by a comment naming where it comes from; with
  `version: 2023-04-20` and `transform: celerity-2023-04-20` (the examples name a later
  specification and a draft transform, which this engine serves under these names), and
  declarations added for variables the example reads but does not declare. A fragment (a
  spec field, a list item, a data file) is wrapped in the smallest blueprint that gives it its
  place; WRAPS below says where each goes and why.
- `variables.json`: values for the variables the example reads (`--var-file`), when it reads
  any.
- `expected.json` is NOT written here: the test (server/trellis/tests/it/celerity_cli.rs)
  writes it with `TRELLIS_BLESS=1` from what `trellis validate --format json` reports, and
  compares with it otherwise. A case whose blueprint changed keeps its old expectation until
  blessed again, so the diff shows what the new text changed.

Run it again after the documentation changes; cases of examples that no longer exist are
removed. The examples are the Celerity documentation's (Apache License 2.0, see
SPEC_DIR/LICENSE-celerity-docs); only the wrappers and the added declarations are ours.
"""

import json
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SPEC = HERE.parents[2] / ".." / "shared" / "spec" / "celerity"

# The in-scope types (issue 17): the documentation file of each, and the case name prefix.
TYPES = {
    "handler": "celerity-handler.mdx",
    "handler-config": "celerity-handler-config.mdx",
    "api": "celerity-api.mdx",
    "consumer": "celerity-consumer.mdx",
    "schedule": "celerity-schedule.mdx",
    "datastore": "celerity-datastore.mdx",
    "queue": "celerity-queue.mdx",
    "topic": "celerity-topic.mdx",
    "bucket": "celerity-bucket.mdx",
    "config": "celerity-config.mdx",
}

VERSION = "2023-04-20"
TRANSFORM = "celerity-2023-04-20"

# Values for the variables the examples read: what a user would pass for them. The type is
# the one a declaration added for an undeclared variable gets.
VARIABLES = {
    "certificateId": ("string", "arn:aws:acm:us-east-1:123456789012:certificate/0a1b2c3d"),
    "dbHost": ("string", "db.example.internal"),
    "dbPort": ("integer", 5432),
    "encryptionAlgorithm": ("string", "aws:kms"),
    "encryptionKeyId": ("string", "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d"),
    "customEncryptionKeyId": ("string", "arn:aws:kms:us-east-1:123456789012:key/4e5f6a7b"),
    "logsBucket": ("string", "example-access-logs"),
    "ordersTopic": ("string", "arn:aws:sns:us-east-1:123456789012:orders"),
    "orderUpdatesTopicId": ("string", "arn:aws:sns:us-east-1:123456789012:order-updates"),
    "orderEventsTopicId": ("string", "arn:aws:sns:us-east-1:123456789012:order-events"),
}

# What a handler needs to deploy: the spec of the handlers wrappers add.
HANDLER_SPEC = "handler: handlers.main\ncodeLocation: ./handlers\nruntime: python3.13.x\n"

# The route of the handler an api wrapper adds (an api routing to no handler deploys nothing
# and is warned about).
HTTP_ROUTE = (
    "celerity.handler.http: true\n"
    "celerity.handler.http.method: \"GET\"\n"
    "celerity.handler.http.path: \"/example\"\n"
)

# A guard map every auth fragment can name: `jwt` as the documentation's examples define it,
# and `rbac` (named by the guard-chain examples) as a custom guard.
GUARDS = """\
auth:
  guards:
    jwt:
      type: jwt
      issuer: "https://identity.example.com/oauth2/v1/"
      tokenSource: "$.headers.Authorization"
      audience:
        - "https://api.example.com/"
    rbac:
      type: custom
"""

# Fragments, by (type, block index): `why` is recorded in the case's header; `spec` is the
# resource spec around the fragment, with `{fragment}` where it goes (its indentation is the
# fragment's); `split` makes one case per blank-line-separated alternative (the example shows
# alternatives for the same field, which one mapping cannot hold); `data_for` makes the block
# a data file of another case instead of a case of its own.
WRAPS = {
    ("api", 0): {
        "why": "a value of an api's `cors` field (spec.cors)",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n{fragment}",
    },
    ("api", 1): {
        "why": "a value of an api's `cors` field (spec.cors)",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n{fragment}",
    },
    ("api", 2): {
        "why": "a value of an api's `domain` field (spec.domain)",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n{fragment}",
    },
    ("api", 3): {
        "why": "a value of an api's `auth` field (spec.auth)",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n{fragment}",
    },
    ("api", 4): {
        "why": "alternative values of `authGuard` in an api's WebSocket configuration "
        "(spec.protocols[].websocketConfig.authGuard), naming guards of spec.auth",
        "type": "celerity/api",
        "selects_handler": "http",
        "split": True,
        "spec": "protocols:\n  - websocketConfig:\n      authStrategy: connect\n"
        "{fragment:6}" + GUARDS,
    },
    ("api", 5): {
        "why": "a value of `basePaths` in an api's domain configuration "
        "(spec.domain.basePaths)",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n  - websocket\ndomain:\n  domainName: api.example.com\n"
        "  basePaths:\n{fragment:4}",
    },
    ("api", 6): {
        "why": "a value of `basePaths` in an api's domain configuration "
        "(spec.domain.basePaths)",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n  - websocket\ndomain:\n  domainName: api.example.com\n"
        "  basePaths:\n{fragment:4}",
    },
    ("api", 7): {
        "why": "alternative values of `defaultGuard` in an api's auth configuration "
        "(spec.auth.defaultGuard), naming guards of spec.auth.guards",
        "type": "celerity/api",
        "selects_handler": "http",
        "split": True,
        "spec": "protocols:\n  - http\n" + GUARDS + "{fragment:2}",
    },
    ("api", 8): {
        "why": "a value of a JWT guard's `tokenSource` (spec.auth.guards.jwt.tokenSource) "
        "for an API serving HTTP and WebSocket",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n  - websocket\nauth:\n  guards:\n    jwt:\n"
        "      type: jwt\n      issuer: \"https://identity.example.com/oauth2/v1/\"\n"
        "      audience:\n        - \"https://api.example.com/\"\n"
        "      tokenSource:\n{fragment:8}",
    },
    ("api", 9): {
        "why": "a value of a JWT guard's `tokenSource` (spec.auth.guards.jwt.tokenSource) "
        "for an API serving HTTP and WebSocket",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n  - websocket\nauth:\n  guards:\n    jwt:\n"
        "      type: jwt\n      issuer: \"https://identity.example.com/oauth2/v1/\"\n"
        "      audience:\n        - \"https://api.example.com/\"\n"
        "      tokenSource:\n{fragment:8}",
    },
    ("api", 14): {
        "why": "the `tokenSource` field of a JWT guard (spec.auth.guards.jwt) for an API "
        "serving HTTP and WebSocket",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n  - websocket\nauth:\n  guards:\n    jwt:\n"
        "      type: jwt\n      issuer: \"https://identity.example.com/oauth2/v1/\"\n"
        "      audience:\n        - \"https://api.example.com/\"\n{fragment:6}",
    },
    ("api", 15): {
        "why": "the `tokenSource` field of a JWT guard (spec.auth.guards.jwt) for an API "
        "serving HTTP and WebSocket",
        "type": "celerity/api",
        "selects_handler": "http",
        "spec": "protocols:\n  - http\n  - websocket\nauth:\n  guards:\n    jwt:\n"
        "      type: jwt\n      issuer: \"https://identity.example.com/oauth2/v1/\"\n"
        "      audience:\n        - \"https://api.example.com/\"\n{fragment:6}",
    },
    ("handler", 0): {
        "why": "a handler's `environmentVariables` field (spec.environmentVariables), with the "
        "fields a deployable handler needs (`handler`, `codeLocation`, `runtime`)",
        "type": "celerity/handler",
        "spec": HANDLER_SPEC + "{fragment}",
    },
    ("handler-config", 0): {
        "why": "a handlerConfig's `environmentVariables` field (spec.environmentVariables), "
        "labelled so that one handler selects it and inherits it (a config alone deploys "
        "nothing; a handler inherits the handlerConfig its own linkSelector selects)",
        "type": "celerity/handlerConfig",
        "selected_by_handler": True,
        "spec": "{fragment}",
    },
    ("schedule", 0): {
        "why": "a schedule's `input` field (spec.input), with the required `schedule` field, "
        "the schedule selecting the handler it triggers by label",
        "type": "celerity/schedule",
        "selects_handler": True,
        "spec": "schedule: \"rate(1 hour)\"\n{fragment}",
    },
    ("datastore", 2): {
        "why": "not a blueprint: the schema file (`schemas/user-store.yaml`) the example before "
        "it names in spec.schemaPath; it is written into that case",
        "data_for": ("datastore", 1, "schemas/user-store.yaml"),
    },
}

# Resources added to whole examples that select (or need) a resource the example does not
# show: `why` is recorded in the case's header; `resources` is appended to the example's
# `resources` section (written with a 2-space step, re-indented to the example's).
HANDLER_SPEC_IN_RESOURCE = "".join("    " + line for line in HANDLER_SPEC.splitlines(True))
ORDERS_HTTP_HANDLER = (
    "ordersHandler:\n  type: \"celerity/handler\"\n  metadata:\n"
    "    labels:\n      application: \"orders\"\n    annotations:\n"
    + "".join("      " + line for line in HTTP_ROUTE.splitlines(True))
    + "  spec:\n" + HANDLER_SPEC_IN_RESOURCE
)
ORDERS_WEBSOCKET_HANDLER = (
    "ordersHandler:\n  type: \"celerity/handler\"\n  metadata:\n"
    "    labels:\n      application: \"orders\"\n    annotations:\n"
    "      celerity.handler.websocket: true\n"
    "      celerity.handler.websocket.route: \"orderStream\"\n"
    "  spec:\n" + HANDLER_SPEC_IN_RESOURCE
)
ADDITIONS = {
    ("schedule", 1): {
        "why": "the handler the schedule triggers (the example selects handlers labelled "
        "`application: jobs` and shows none)",
        "resources": "jobsHandler:\n  type: \"celerity/handler\"\n  metadata:\n"
        "    labels:\n      application: \"jobs\"\n  spec:\n" + HANDLER_SPEC_IN_RESOURCE,
    },
    ("consumer", 0): {
        "why": "the handler the consumer invokes (the example selects handlers labelled "
        "`application: orders` and shows none)",
        "resources": "ordersHandler:\n  type: \"celerity/handler\"\n  metadata:\n"
        "    labels:\n      application: \"orders\"\n  spec:\n" + HANDLER_SPEC_IN_RESOURCE,
    },
    ("api", 10): {
        "why": "the handler the api routes to (the example selects handlers labelled "
        "`application: orders` and shows none)",
        "resources": ORDERS_HTTP_HANDLER,
    },
    ("api", 11): {
        "why": "the WebSocket handler the api routes to (the example selects handlers labelled "
        "`application: orders` and shows none)",
        "resources": ORDERS_WEBSOCKET_HANDLER,
    },
    ("api", 12): {
        "why": "the WebSocket handler the api routes to (the example selects handlers labelled "
        "`application: orders` and shows none)",
        "resources": ORDERS_WEBSOCKET_HANDLER,
    },
    ("api", 13): {
        "why": "the handler the api routes to (the example selects handlers labelled "
        "`application: orders` and shows none)",
        "resources": ORDERS_HTTP_HANDLER,
    },
    ("topic", 1): {
        "why": "a handlerConfig giving `createOrderHandler` its `codeLocation` (the example's "
        "handler has none, and its selector `application: orders` picks this config), as the "
        "handlerConfig documentation shares code locations",
        "resources": "ordersHandlerConfig:\n  type: \"celerity/handlerConfig\"\n  metadata:\n"
        "    labels:\n      application: \"orders\"\n  spec:\n    codeLocation: ./handlers\n",
    },
}

# Parts whole examples leave out, written as a comment ending in `...`: each is filled with
# the least that makes its place valid, and the case's header says so. (comment pattern,
# replacement at the comment's indentation, what the replacement is.)
ELISIONS = [
    (
        r"# API spec configuration \.\.\.",
        "protocols:\n  - http\n",
        "the api's elided spec with `protocols: [http]`",
    ),
    (
        r"# Consumer configuration \.\.\.",
        "sourceId: \"${variables.orderUpdatesTopicId}\"\n",
        "the consumer's elided spec with the `sourceId` the documentation's other example of "
        "the same `Order Updates Consumer` gives it (the topic from another blueprint)",
    ),
    (
        r"# Data store configuration \.\.\.",
        "keys:\n  partitionKey: id\n",
        "the datastore's elided spec with its required `keys.partitionKey`",
    ),
]


def elided_resources(s):
    """What stands in for elided resources (`resources:` holding `# ...` alone): one handler,
    indented by the document's step `s`."""
    return (
        f"{' ' * s}exampleHandler:\n{' ' * 2 * s}type: \"celerity/handler\"\n"
        f"{' ' * 2 * s}spec:\n" + indent(HANDLER_SPEC, 3 * s)
    )


def fill_elisions(text):
    """The document with its elided parts filled, and a header line for each kind filled."""
    notes = []
    for pattern, replacement, what in ELISIONS:
        found = re.search(r"^([ \t]*)" + pattern + r"[ \t]*\n", text, re.M)
        if not found:
            continue
        text = re.sub(
            r"^([ \t]*)" + pattern + r"[ \t]*\n",
            lambda m: indent(replacement, len(m.group(1))),
            text,
            flags=re.M,
        )
        notes.append(f"# Filled: {what}.\n")
    m = re.search(r"^resources:[ \t]*\n([ \t]+)# \.\.\.[ \t]*\n", text, re.M)
    if m:
        text = (
            text[: m.start()]
            + "resources:\n"
            + elided_resources(step(text))
            + text[m.end() :]
        )
        notes.append("# Filled: the elided resources with one handler.\n")
    # A `variables:` section holding only `# Variable definitions ...`: the example declares
    # nothing there (what it reads is declared by `declare`).
    m = re.search(r"^variables:[ \t]*\n[ \t]+# Variable definitions \.\.\.[ \t]*\n", text, re.M)
    if m:
        text = text[: m.start()] + "variables:\n" + text[m.end() :]
        if not re.search(r"\$\{[^}]*variables\.", text):
            text = text.replace("variables:\n", "", 1)
        notes.append("# Filled: the elided variable definitions (none besides those read).\n")
    return text, "".join(notes)


YAML_BLOCK = re.compile(r"```yaml[^\n]*\n(.*?)```", re.S)


def indent(text, n):
    pad = " " * n
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


def fill(template, fragment):
    """Puts `fragment` into a spec template at `{fragment}` or `{fragment:N}` (N spaces)."""
    m = re.search(r"\{fragment(?::(\d+))?\}", template)
    n = int(m.group(1) or 0)
    body = indent(fragment if fragment.endswith("\n") else fragment + "\n", n)
    return template[: m.start()] + body + template[m.end() :]


def alternatives(fragment):
    """The blank-line-separated groups of a fragment, each with the comment lines above it."""
    groups = [g.strip("\n") + "\n" for g in re.split(r"\n\s*\n", fragment) if g.strip()]
    return groups


def used_variables(text):
    return sorted(set(re.findall(r"\$\{[^}]*?variables\.(\w+)", text)))


def declared_variables(text):
    m = re.search(r"^variables:[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n)*)", text, re.M)
    if not m:
        return set()
    block = m.group(1)
    first = re.search(r"^([ \t]+)\S", block, re.M)
    if not first:
        return set()
    pad = len(first.group(1))
    return set(re.findall(r"^ {%d}(\w+):" % pad, block, re.M))


def step(text):
    """The indentation step the document uses (the first indented line's, comments aside)."""
    m = re.search(r"^( +)[^\s#]", text, re.M)
    return len(m.group(1)) if m else 2


def declare(text, names):
    """Adds `variables` declarations for `names` (each with the type VARIABLES gives)."""
    if not names:
        return text
    s = step(text)
    decl = "".join(
        f"{' ' * s}{n}:\n{' ' * 2 * s}type: {VARIABLES[n][0]}\n" for n in names
    )
    m = re.search(r"^variables:[ \t]*\n", text, re.M)
    if m:
        return text[: m.end()] + decl + text[m.end() :]
    m = re.search(r"^resources:", text, re.M)
    at = m.start() if m else len(text)
    return text[:at] + "variables:\n" + decl + text[at:]


def versioned(text):
    """The document with this engine's version and transform, and `type: number` variables as
    `float` (the 2023-04-20 specification's variable types are string, integer, float and
    boolean; `number` is the later specification's)."""
    lines = text.splitlines(True)
    out, skipping = [], False
    have_version = have_transform = False
    for line in lines:
        if skipping:
            # The items of a `transform:` list.
            if re.match(r"^[ \t]+- ", line):
                continue
            skipping = False
        if re.match(r"^version:", line):
            out.append(f"version: {VERSION}\n")
            have_version = True
        elif re.match(r"^transform:", line):
            out.append(f"transform: {TRANSFORM}\n")
            have_transform = True
            skipping = re.match(r"^transform:\s*$", line) is not None
        elif re.match(r"^[ \t]+type:[ \t]*number[ \t]*$", line) and in_variables(out):
            out.append(line.replace("number", "float"))
        else:
            out.append(line)
    head = []
    if not have_version:
        head.append(f"version: {VERSION}\n")
    if not have_transform:
        head.append(f"transform: {TRANSFORM}\n")
    return "".join(head + out)


def in_variables(lines):
    """Whether the next line is inside the top-level `variables` section."""
    for line in reversed(lines):
        if re.match(r"^\S", line) and not line.startswith("#"):
            return line.startswith("variables:")
    return False


def wrapped(kind, fragment, wrap):
    """A fragment inside the smallest blueprint that gives it its place."""
    spec = fill(wrap["spec"], fragment)
    name = {"api": "exampleApi", "handler": "exampleHandler",
            "handler-config": "exampleHandlerConfig", "schedule": "exampleSchedule"}[kind]
    out = f"resources:\n  {name}:\n    type: \"{wrap['type']}\"\n"
    if wrap.get("selected_by_handler"):
        out += "    metadata:\n      labels:\n        app: example\n"
    if wrap.get("selects_handler"):
        out += "    linkSelector:\n      byLabel:\n        app: example\n"
    out += "    spec:\n" + indent(spec, 6)
    if wrap.get("selected_by_handler"):
        out += (
            "  exampleHandler:\n    type: \"celerity/handler\"\n"
            "    linkSelector:\n      byLabel:\n        app: example\n"
            "    spec:\n" + indent(HANDLER_SPEC, 6)
        )
    if wrap.get("selects_handler"):
        out += (
            "  exampleHandler:\n    type: \"celerity/handler\"\n    metadata:\n"
            "      labels:\n        app: example\n"
        )
        if wrap["selects_handler"] == "http":
            out += "      annotations:\n" + indent(HTTP_ROUTE, 8)
        out += "    spec:\n" + indent(HANDLER_SPEC, 6)
    return out


def header(source, index, line, why):
    out = f"# From {source}, YAML example {index + 1} (line {line}).\n"
    if why:
        out += f"# Wrapped: {why}.\n"
    return out


def add_resources(text, addition):
    """The document with `addition["resources"]` appended to its `resources` section (the
    last top-level section of every example ADDITIONS names)."""
    s = step(text)
    body = "".join(
        " " * (s * (len(line) - len(line.lstrip(" "))) // 2) + line.lstrip(" ")
        if line.strip()
        else line
        for line in addition["resources"].splitlines(True)
    )
    return text.rstrip("\n") + "\n\n" + indent(body, s)


def case(out_dir, name, text, comment, data=None, addition=None):
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    if addition:
        text = add_resources(text, addition)
        comment += f"# Added: {addition['why']}.\n"
    text, notes = fill_elisions(versioned(text))
    comment += notes
    used = used_variables(text)
    missing = [v for v in used if v not in declared_variables(text)]
    if missing:
        comment += (
            "# Declared here: "
            + ", ".join(f"`{v}`" for v in missing)
            + " (the example reads them without declaring them).\n"
        )
        text = declare(text, missing)
    (d / "blueprint.yaml").write_text(comment + text)
    values = d / "variables.json"
    if used:
        values.write_text(
            json.dumps({v: VARIABLES[v][1] for v in used}, indent=2) + "\n"
        )
    elif values.exists():
        values.unlink()
    for path, content in (data or {}).items():
        p = d / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    return name


def main():
    spec_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SPEC
    written = set()
    data_files = {}
    blocks = {}
    for kind, doc in TYPES.items():
        text = (spec_dir / doc).read_text()
        for i, m in enumerate(YAML_BLOCK.finditer(text)):
            line = text.count("\n", 0, m.start()) + 2
            blocks[(kind, i)] = (doc, line, m.group(1))
    for key, (doc, line, body) in blocks.items():
        wrap = WRAPS.get(key)
        if wrap and "data_for" in wrap:
            kind, index, path = wrap["data_for"]
            data_files.setdefault((kind, index), {})[path] = (
                header(doc, key[1], line, wrap["why"]) + body
            )
    for (kind, i), (doc, line, body) in blocks.items():
        wrap = WRAPS.get((kind, i))
        base = f"{kind}-{i:02d}"
        data = data_files.get((kind, i))
        if wrap is None:
            if not re.search(r"^resources:", body, re.M):
                sys.exit(f"{doc} example {i + 1} (line {line}) is a fragment: add it to WRAPS")
            written.add(
                case(HERE, base, body, header(doc, i, line, None), data, ADDITIONS.get((kind, i)))
            )
        elif "data_for" in wrap:
            continue
        elif wrap.get("split"):
            for j, alt in enumerate(alternatives(body)):
                written.add(
                    case(
                        HERE,
                        f"{base}{'abcdefgh'[j]}",
                        wrapped(kind, alt, wrap),
                        header(doc, i, line, f"{wrap['why']}; alternative {j + 1}"),
                        data,
                    )
                )
        else:
            written.add(
                case(HERE, base, wrapped(kind, body, wrap), header(doc, i, line, wrap["why"]), data)
            )
    for d in HERE.iterdir():
        if d.is_dir() and d.name not in written:
            shutil.rmtree(d)
    print(f"{len(written)} cases in {HERE}")


if __name__ == "__main__":
    main()

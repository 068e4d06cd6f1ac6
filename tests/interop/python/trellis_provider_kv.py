#!/usr/bin/env python3
"""kv: a Trellis provider built on the Python SDK (sdk/python), launched by bin/trellis-provider-kv.

Resource type `kv/entry`: spec `key` and `value` (strings); each entry is the file
<dir>/<key> holding the value. `dir` comes from the provider config, else
$XDG_STATE_HOME/trellis-kv (~/.local/state/trellis-kv). Read reports drift (an edited or
removed file); destroying twice is fine; an entry made by hand is imported by its key.
"""

import os
import re

from trellis_plugin import (Applied, BadInput, Diagnostic, Field, Found, Provider, Resource,
                            ResourceState, String, serve)

# A key is a file name: nothing that could leave the directory or hide in it.
KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
STATE_HOME = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
DEFAULT_DIR = os.path.join(STATE_HOME, "trellis-kv")


def entries_dir(ctx):
    d = ctx.config.get("dir") or DEFAULT_DIR
    if not os.path.isabs(d):
        raise BadInput("the provider config's dir must be an absolute path")
    return d


def entry_file(ctx, key):
    if not KEY.fullmatch(key):
        raise BadInput("key must be a file name: letters, digits, '_', '.', '-'", "key")
    return os.path.join(entries_dir(ctx), key)


class Entry(Resource):
    type_name = "kv/entry"
    description = "A key and its value, kept as the file <dir>/<key>."
    fields = [
        Field("key", String, required=True, must_recreate=True, description="The entry's name."),
        Field("value", String, required=True, description="What the entry holds."),
        Field("path", String, computed=True, description="The file holding the value."),
    ]

    def validate(self, ctx, spec):
        key = spec.get("key")  # UNKNOWN (known only at deploy) is skipped: it is falsy
        if key and isinstance(key, str) and not KEY.fullmatch(key):
            return [Diagnostic.error("kv.bad-key", "the key is not a valid file name", "key",
                                     hint="use letters, digits, '_', '.' and '-'")]
        return []

    def apply(self, ctx, spec, current):
        path = entry_file(ctx, spec["key"])
        ctx.progress("writing the entry", 0.5)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Write then rename: a reader never sees half a value, and a retry just rewrites it.
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(spec["value"])
        os.replace(tmp, path)
        return Applied(external_id=spec["key"], state={"path": path})

    def read(self, ctx, current):
        key = current.external_id or current.spec.get("key", "")
        path = entry_file(ctx, key)
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read()
        except FileNotFoundError:
            return None
        return Found(spec={"key": key, "value": value}, state={"path": path}, external_id=key)

    def import_resource(self, ctx, external_id, name):
        # The id is the key, and read finds the whole entry from it.
        return self.read(ctx, ResourceState(self.type_name, name, external_id, {}, {}))

    def destroy(self, ctx, current):
        try:
            os.remove(entry_file(ctx, current.external_id or current.spec.get("key", "")))
        except FileNotFoundError:
            pass  # already gone: a retried destroy must succeed


class KV(Provider):
    name = "kv"
    version = "0.1.0"
    config = [Field("dir", String, description="Absolute directory of the entries' files.")]
    resources = [Entry]

    def validate_config(self, ctx):
        d = ctx.config.get("dir")
        if d and not os.path.isabs(d):
            return [Diagnostic.error("kv.dir-relative", "dir must be an absolute path", "dir")]
        return []


if __name__ == "__main__":
    serve(KV())

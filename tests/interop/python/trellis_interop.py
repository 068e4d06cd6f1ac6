"""Helpers shared by the pyecho provider and its engine-side self-test.

Loads the stubs that gen.sh generates from proto/trellis/plugin/v1/*.proto
(into _gen/, untracked) and converts between trellis.plugin.v1.Value and plain
Python values. Nothing here comes from the Rust SDK: only the .proto files.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GEN_DIR = os.path.join(HERE, "_gen")


def ensure_stubs():
    """Runs `gen.sh --if-stale`, so the stubs exist and match the .proto files."""
    subprocess.run(
        ["bash", os.path.join(HERE, "gen.sh"), "--if-stale"],
        check=True,
        stdout=sys.stderr,
    )


if not os.path.isdir(os.path.join(GEN_DIR, "trellis")):
    ensure_stubs()
if GEN_DIR not in sys.path:
    sys.path.insert(0, GEN_DIR)

from trellis.plugin.v1 import plugin_pb2, plugin_pb2_grpc, types_pb2  # noqa: E402

__all__ = [
    "plugin_pb2",
    "plugin_pb2_grpc",
    "types_pb2",
    "UNKNOWN",
    "to_value",
    "from_value",
    "map_get",
    "attr_path",
    "path_to_list",
    "make_error",
    "error_class",
]


class _Unknown:
    """The Python side of `Value.unknown`: known only after deploy."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "UNKNOWN"


UNKNOWN = _Unknown()


def to_value(obj, sensitive=False):
    """Python -> Value. dicts keep their insertion order (Value maps are ordered)."""
    v = types_pb2.Value(sensitive=sensitive)
    if obj is None:
        v.null = types_pb2.NULL_VALUE
    elif obj is UNKNOWN:
        v.unknown.SetInParent()
    elif isinstance(obj, bool):  # before int: bool is an int in Python
        v.bool = obj
    elif isinstance(obj, int):
        v.int = obj
    elif isinstance(obj, float):
        v.float = obj
    elif isinstance(obj, str):
        v.string = obj
    elif isinstance(obj, types_pb2.Value):
        v.CopyFrom(obj)
        if sensitive:
            v.sensitive = True
    elif isinstance(obj, (list, tuple)):
        v.list.SetInParent()
        for item in obj:
            v.list.items.append(to_value(item))
    elif isinstance(obj, dict):
        v.map.SetInParent()
        for key, item in obj.items():
            v.map.entries.add(key=str(key), value=to_value(item))
    else:
        raise TypeError(f"no Value for {type(obj).__name__}")
    return v


def from_value(v):
    """Value -> Python. A Value with no kind set (or an absent one) is None.

    The `sensitive` flag is dropped; read it from the Value itself.
    """
    if v is None:
        return None
    kind = v.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    if kind == "unknown":
        return UNKNOWN
    if kind == "list":
        return [from_value(item) for item in v.list.items]
    if kind == "map":
        return {e.key: from_value(e.value) for e in v.map.entries}
    return getattr(v, kind)  # bool, int, float, string


def map_get(v, key):
    """The Value under `key` in a map Value, or None (absent, or not a map)."""
    if v is None or v.WhichOneof("kind") != "map":
        return None
    for entry in v.map.entries:
        if entry.key == key:
            return entry.value
    return None


def attr_path(*steps):
    """attr_path("spec-field", 0) -> AttributePath: str steps are fields, int steps indexes."""
    p = types_pb2.AttributePath()
    for step in steps:
        if isinstance(step, int):
            p.steps.add(index=step)
        else:
            p.steps.add(field=step)
    return p


def path_to_list(p):
    """AttributePath -> ["field", 0, ...]."""
    return [getattr(s, s.WhichOneof("step")) for s in p.steps]


def make_error(cls, message, path=None, partial_state=None):
    """An application Error. Its class field is named `class`, a Python keyword,
    so it can only be set through keyword-argument unpacking or setattr."""
    err = types_pb2.Error(error_class=cls, message=message)
    if path is not None:
        err.path.CopyFrom(path)
    if partial_state is not None:
        err.partial_state.CopyFrom(partial_state)
    return err


def error_class(err):
    """Error.class (a Python keyword, hence getattr)."""
    return err.error_class

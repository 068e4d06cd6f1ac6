"""Python values <-> trellis.plugin.v1.Value, and attribute paths.

Plain Python stands for the JSON-like part: None, bool, int, float, str, list (or tuple)
and dict (insertion-ordered, like the protocol's maps). Two markers carry the rest:

- `UNKNOWN`: a value known only after deploy (`Value.unknown`);
- `Sensitive(x)`: a secret (`Value.sensitive`). Its repr and str never show `x`, so a
  secret that ends up in a log line or an f-string shows as `Sensitive(***)`.
"""

from ._stubs import types_pb2

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Unknown:
    """The type of UNKNOWN; there is only one."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "UNKNOWN"

    def __bool__(self):
        # `if spec.get("x"):` must not take an unknown for a real value.
        return False


UNKNOWN = _Unknown()


class Sensitive:
    """A secret value. `.value` is the value itself; repr and str hide it."""

    __slots__ = ("value",)

    def __init__(self, value):
        # Sensitive(Sensitive(x)) is just Sensitive(x).
        self.value = value.value if isinstance(value, Sensitive) else value

    def __repr__(self):
        return "Sensitive(***)"

    __str__ = __repr__

    def __eq__(self, other):
        return isinstance(other, Sensitive) and self.value == other.value

    def __hash__(self):
        return hash(("Sensitive", self.value))


def is_unknown(x):
    return x is UNKNOWN


def contains_unknown(x):
    """True when UNKNOWN is x or anywhere inside it."""
    if isinstance(x, Sensitive):
        x = x.value
    if x is UNKNOWN:
        return True
    if isinstance(x, dict):
        return any(contains_unknown(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(contains_unknown(v) for v in x)
    return False


def reveal(x):
    """x with every Sensitive wrapper removed, at any depth."""
    if isinstance(x, Sensitive):
        return reveal(x.value)
    if isinstance(x, dict):
        return {k: reveal(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [reveal(v) for v in x]
    return x


def to_value(obj, sensitive=False):
    """Python -> Value. A `Value` message passes through (copied)."""
    if isinstance(obj, Sensitive):
        return to_value(obj.value, sensitive=True)
    v = types_pb2.Value()
    if isinstance(obj, types_pb2.Value):
        v.CopyFrom(obj)
    elif obj is None:
        v.null = types_pb2.NULL_VALUE
    elif obj is UNKNOWN:
        v.unknown.SetInParent()
    elif isinstance(obj, bool):  # before int: a bool is an int in Python
        v.bool = obj
    elif isinstance(obj, int):
        if not INT64_MIN <= obj <= INT64_MAX:
            raise ValueError(f"integer {obj} does not fit in 64 bits")
        v.int = obj
    elif isinstance(obj, float):
        v.float = obj
    elif isinstance(obj, str):
        v.string = obj
    elif isinstance(obj, (list, tuple)):
        v.list.SetInParent()  # an empty list is still a list, not "no kind"
        v.list.items.extend(to_value(item) for item in obj)
    elif isinstance(obj, dict):
        v.map.SetInParent()
        for key, item in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"map keys must be strings, not {type(key).__name__}")
            v.map.entries.add(key=key, value=to_value(item))
    else:
        raise TypeError(f"no trellis Value for a {type(obj).__name__}")
    if sensitive:
        v.sensitive = True
    return v


def from_value(v, keep_sensitive=False):
    """Value -> Python. A Value with no kind (or None) is None; unknown is UNKNOWN.

    Sensitive marks are dropped unless keep_sensitive, which wraps each marked value in
    Sensitive (so to_value(from_value(v, keep_sensitive=True)) == v).
    """
    if v is None:
        return None
    kind = v.WhichOneof("kind")
    if kind is None or kind == "null":
        out = None
    elif kind == "unknown":
        out = UNKNOWN
    elif kind == "list":
        out = [from_value(item, keep_sensitive) for item in v.list.items]
    elif kind == "map":
        out = {e.key: from_value(e.value, keep_sensitive) for e in v.map.entries}
    else:
        out = getattr(v, kind)  # bool, int, float, string
    if keep_sensitive and v.sensitive:
        return Sensitive(out)
    return out


def kind_name(v):
    """A short name of a Python value's protocol kind, for messages."""
    if isinstance(v, Sensitive):
        return kind_name(v.value)
    if v is None:
        return "null"
    if v is UNKNOWN:
        return "unknown"
    for t, name in ((bool, "boolean"), (int, "integer"), (float, "float"), (str, "string"),
                    (dict, "map"), ((list, tuple), "list")):
        if isinstance(v, t):
            return name
    return type(v).__name__


# ---------------------------------------------------------------- paths


def to_path(path):
    """An AttributePath from "field", 3, or a sequence of them (str: field, int: index)."""
    if isinstance(path, types_pb2.AttributePath):
        return path
    if isinstance(path, (str, int)):
        path = [path]
    p = types_pb2.AttributePath()
    for step in path or []:
        if isinstance(step, bool) or not isinstance(step, (str, int)):
            raise TypeError(f"a path step is a str (field) or an int (index), not {step!r}")
        if isinstance(step, int):
            p.steps.add(index=step)
        else:
            p.steps.add(field=step)
    return p


def from_path(p):
    """AttributePath -> ["field", 0, ...]."""
    return [getattr(s, s.WhichOneof("step")) for s in p.steps]


def sensitive_paths(v, prefix=()):
    """The paths (tuples) of every value marked sensitive inside v."""
    found = []
    if v is None:
        return found
    if v.sensitive:
        found.append(tuple(prefix))
    kind = v.WhichOneof("kind")
    if kind == "map":
        for e in v.map.entries:
            found.extend(sensitive_paths(e.value, (*prefix, e.key)))
    elif kind == "list":
        for i, item in enumerate(v.list.items):
            found.extend(sensitive_paths(item, (*prefix, i)))
    return found


def value_at(v, path):
    """The Value at path inside v, or None."""
    for step in path:
        if v is None:
            return None
        kind = v.WhichOneof("kind")
        if isinstance(step, int) and kind == "list":
            v = v.list.items[step] if 0 <= step < len(v.list.items) else None
        elif isinstance(step, str) and kind == "map":
            v = next((e.value for e in v.map.entries if e.key == step), None)
        else:
            return None
    return v


def mark_sensitive(v, paths):
    """Sets the sensitive flag on the values at `paths` inside v, where they exist."""
    for path in paths:
        target = value_at(v, path)
        if target is not None and target.WhichOneof("kind") not in (None, "null"):
            target.sensitive = True
    return v

"""Declaring schemas: value types, fields of a resource spec or a provider's configuration,
and function parameters. Each turns into exactly what GetManifest sends."""

from ._stubs import plugin_pb2
from .values import UNKNOWN, Sensitive, to_value


class Type:
    """A value's schema: one of the constants below, or Array(...), Map(...), Object(...)."""

    def __init__(self, kind, *, items=None, values=None, fields=None, description=""):
        self.kind = kind  # a SchemaType name: "STRING", "ARRAY", ...
        self.items = items
        self.values = values
        self.fields = list(fields or [])
        self.description = description

    def to_proto(self, description="", allowed=None, default=None):
        s = plugin_pb2.Schema(
            type=plugin_pb2.SchemaType.Value("SCHEMA_TYPE_" + self.kind),
            description=description or self.description,
        )
        if self.items is not None:
            s.items.CopyFrom(self.items.to_proto())
        if self.values is not None:
            s.values.CopyFrom(self.values.to_proto())
        s.fields.extend(f.to_proto() for f in self.fields)
        s.allowed_values.extend(to_value(v) for v in allowed or [])
        if default is not None:
            s.default.CopyFrom(to_value(default))
        return s

    def accepts(self, x):
        """Whether a (known, non-null) Python value has this type: what a function's
        arguments are checked against before the call."""
        if isinstance(x, Sensitive):
            x = x.value
        if self.kind == "ANY":
            return True
        if self.kind == "STRING":
            return isinstance(x, str)
        if self.kind == "INTEGER":
            return isinstance(x, int) and not isinstance(x, bool)
        if self.kind == "FLOAT":  # an integer is a fine float
            return isinstance(x, (int, float)) and not isinstance(x, bool)
        if self.kind == "BOOLEAN":
            return isinstance(x, bool)
        if self.kind == "ARRAY":
            return isinstance(x, list)
        return isinstance(x, dict)  # OBJECT, MAP

    def __repr__(self):
        return self.kind


Any = Type("ANY")
String = Type("STRING")
Integer = Type("INTEGER")
Float = Type("FLOAT")
Boolean = Type("BOOLEAN")


def Array(items):
    """A list whose elements are `items`."""
    return Type("ARRAY", items=items)


def Map(values):
    """A map with arbitrary string keys, each value a `values`."""
    return Type("MAP", values=values)


def Object(*fields):
    """A map with fixed fields: Object(Field(...), Field(...))."""
    return Type("OBJECT", fields=fields)


class Field:
    """One field of an OBJECT: a resource spec's, the provider configuration's, or a nested one.

    required:      must be set in the blueprint
    computed:      set by the provider (returned in state); a blueprint may not set it
    sensitive:     secret: the SDK marks its value sensitive in every state and read spec
    default:       used when the field is not set; the SDK fills it in before your callback
    must_recreate: a change replaces the resource instead of updating it
    allowed:       the allowed values (scalars)
    local_asset:   a STRING naming a file the client sends (docs/assets.md); read it at
                   ctx.local_asset(uri)
    """

    def __init__(self, name, type, *, required=False, computed=False, sensitive=False,
                 default=None, description="", must_recreate=False, allowed=None,
                 local_asset=False):
        if not isinstance(type, Type):
            raise TypeError(f"field {name}: the type is a Type (String, Array(...), ...)")
        self.name = name
        self.type = type
        self.required = required
        self.computed = computed
        self.sensitive = sensitive
        self.default = default
        self.description = description
        self.must_recreate = must_recreate
        self.allowed = allowed
        self.local_asset = local_asset

    def to_proto(self):
        return plugin_pb2.SchemaField(
            name=self.name,
            schema=self.type.to_proto(self.description, self.allowed, self.default),
            required=self.required,
            computed=self.computed,
            sensitive=self.sensitive,
            must_recreate=self.must_recreate,
            local_asset=self.local_asset,
        )


def object_schema(fields, description=""):
    return Object(*fields).to_proto(description)


def fill_defaults(fields, spec):
    """spec (a dict) with each absent or null field's default, in nested objects too.
    The engine does not fill defaults in (docs/plugin-protocol.md): the SDK does."""
    if not isinstance(spec, dict):
        return spec
    out = dict(spec)
    for f in fields:
        if out.get(f.name) is None and f.default is not None:
            out[f.name] = f.default
        elif f.type.kind == "OBJECT" and isinstance(out.get(f.name), dict):
            out[f.name] = fill_defaults(f.type.fields, out[f.name])
    return out


def missing_required(fields, spec):
    """The first required (not computed) field absent or null in spec, or None. Unknown
    counts as set: it will be known at deploy."""
    for f in fields:
        if f.required and not f.computed and (not isinstance(spec, dict) or spec.get(f.name) is None):
            return f.name
    return None


def sensitive_field_paths(fields):
    """Paths of fields declared sensitive (top level and inside nested objects)."""
    paths = []
    for f in fields:
        if f.sensitive:
            paths.append((f.name,))
        elif f.type.kind == "OBJECT":
            paths.extend((f.name, *p) for p in sensitive_field_paths(f.type.fields))
    return paths


class Param:
    """A function parameter. Optional ones may be missing from the end of the arguments
    (your function then gets None for them)."""

    def __init__(self, name, type, *, optional=False, description=""):
        self.name = name
        self.type = type
        self.optional = optional
        self.description = description

    def to_proto(self):
        return plugin_pb2.FunctionParam(
            name=self.name,
            type=plugin_pb2.SchemaType.Value("SCHEMA_TYPE_" + self.type.kind),
            optional=self.optional,
            description=self.description,
        )


class FunctionDef:
    """What @function records on a provider method."""

    def __init__(self, method, name, params, returns, variadic, description):
        self.method = method
        self.name = name
        self.params = list(params)
        self.returns = returns
        self.variadic = variadic
        self.description = description

    def to_proto(self):
        d = plugin_pb2.FunctionDef(
            name=self.name,
            description=self.description,
            params=[p.to_proto() for p in self.params],
            returns=plugin_pb2.SchemaType.Value("SCHEMA_TYPE_" + self.returns.kind),
        )
        if self.variadic is not None:
            d.variadic.CopyFrom(self.variadic.to_proto())
        return d


def function(*, params=(), returns=Any, variadic=None, description="", name=None):
    """Declares a provider method as a function usable in ${..} substitutions:

        @function(params=[Param("s", String)], returns=String)
        def upper(self, ctx, s):
            return s.upper()

    The SDK checks the argument count and types first (BAD_INPUT at [index N]), answers
    unknown without calling you when an argument is unknown, and marks the result
    sensitive when an argument was.
    """

    def mark(method):
        method.__trellis_function__ = FunctionDef(
            method, name or method.__name__, params, returns, variadic,
            description or (method.__doc__ or "").strip().split("\n")[0],
        )
        return method

    return mark


__all__ = [
    "Any", "String", "Integer", "Float", "Boolean", "Array", "Map", "Object", "Type",
    "Field", "Param", "function", "UNKNOWN",
]

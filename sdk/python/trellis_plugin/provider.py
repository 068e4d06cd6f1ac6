"""What a provider author subclasses and returns: Provider, Resource and their results."""

from dataclasses import dataclass, field

from ._stubs import plugin_pb2, types_pb2
from .schema import FunctionDef
from .values import to_path


class Resource:
    """One resource type. Subclass it, set `type_name` and `fields`, and implement `apply`
    and `destroy`; `validate`, `read` and `import_resource` are optional (`read` enables
    drift detection and declares the provider's `read_resource` capability;
    `import_resource` makes the type importable)."""

    type_name = ""        # "<namespace>/<type>", e.g. "kv/entry"
    description = ""
    fields = []           # [Field(...)]: the spec schema, blueprint and computed fields

    def validate(self, ctx, spec):
        """Checks beyond the schema (the engine checks types, required and allowed values
        itself). spec may contain UNKNOWN: skip what you cannot check. Returns a list of
        Diagnostic. No side effects."""
        return []

    def apply(self, ctx, spec, current):
        """Creates (current is None) or updates (current is the ResourceState) the resource
        so it matches spec (a dict, defaults filled in). Returns Applied. Report progress
        with ctx.progress(message, fraction). Must be safe to repeat with the same
        ctx.idempotency_key."""
        raise NotImplementedError(f"{self.type_name}: apply")

    def destroy(self, ctx, current):
        """Deletes the resource. Deleting what is already gone must succeed."""
        raise NotImplementedError(f"{self.type_name}: destroy")

    def read(self, ctx, current):
        """The resource as it exists now: Found(spec, state), or None when it is gone.
        Read only. Not overriding it means the provider cannot report drift."""
        raise NotImplementedError(f"{self.type_name}: read")

    def import_resource(self, ctx, external_id, name):
        """An existing resource found by the id a user gave (`trellis import`), as a
        blueprint would declare it: Found(spec with every field a blueprint sets, state,
        external_id as apply gives it), or None when there is none. Read only. Overriding
        it declares the type importable (and the provider's `import_resource` capability)."""
        raise NotImplementedError(f"{self.type_name}: import_resource")


class Provider:
    """A provider plugin: a namespace with resource types and functions.

    Functions are methods decorated with @function; config is the provider
    configuration's fields (CallContext.provider_config, as ctx.config).
    """

    name = ""             # the namespace: "kv" for "kv/entry"
    version = "0.0.0"
    config = []           # [Field(...)]
    resources = []        # [Resource instance or class]
    # How the engine retries TRANSIENT errors (the Rust SDK's default).
    retry_policy = plugin_pb2.RetryPolicy(
        max_attempts=3, initial_backoff_ms=200, max_backoff_ms=5000, multiplier=2.0
    )

    def validate_config(self, ctx):
        """Checks ctx.config beyond its schema. Returns a list of Diagnostic (paths are
        relative to the configuration)."""
        return []

    # ------------------------------------------------------------ used by the SDK

    def resource_types(self):
        return [r() if isinstance(r, type) else r for r in self.resources]

    def function_defs(self):
        """The @function methods, in the order the classes define them (the manifest must
        not change between runs)."""
        seen = {}
        for klass in reversed(type(self).__mro__):
            for attr, member in vars(klass).items():
                fdef = getattr(member, "__trellis_function__", None)
                if isinstance(fdef, FunctionDef):
                    seen[attr] = fdef
        return list(seen.values())


@dataclass
class ResourceState:
    """A resource as the engine knows it: the spec as last applied, the computed state."""

    type_name: str
    name: str
    external_id: str
    spec: dict
    state: dict


@dataclass
class Applied:
    """What apply returns: the provider's id for the resource and its computed fields."""

    external_id: str
    state: dict = field(default_factory=dict)


@dataclass
class Found:
    """What read returns while the resource exists: its spec now (compared with the applied
    spec for drift), its computed fields now, and its id when the engine asked without one
    (a create cut short by a crash)."""

    spec: dict
    state: dict = field(default_factory=dict)
    external_id: str = ""


@dataclass
class Diagnostic:
    """A validation finding. Build with Diagnostic.error/warning/info(code, message, ...)."""

    severity: int
    code: str
    message: str
    path: object = None
    hint: str = ""

    @classmethod
    def error(cls, code, message, path=None, hint=""):
        return cls(types_pb2.SEVERITY_ERROR, code, message, path, hint)

    @classmethod
    def warning(cls, code, message, path=None, hint=""):
        return cls(types_pb2.SEVERITY_WARNING, code, message, path, hint)

    @classmethod
    def info(cls, code, message, path=None, hint=""):
        return cls(types_pb2.SEVERITY_INFO, code, message, path, hint)

    def to_proto(self):
        d = types_pb2.Diagnostic(
            severity=self.severity, code=self.code, message=self.message, hint=self.hint
        )
        if self.path is not None:
            d.path.CopyFrom(to_path(self.path))
        return d

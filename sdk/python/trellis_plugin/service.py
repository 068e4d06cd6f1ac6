"""The gRPC servicers: Plugin and Provider, on top of a Provider declaration.

Every handler turns the request into plain Python, calls the author's callback, and turns
the result, or the exception, back into the response. An exception never escapes: the
protocol wants application errors inside responses, and a plugin must not crash on input.
"""

import hmac
import logging
import queue
import threading
import time
from concurrent import futures

import grpc

from ._stubs import plugin_pb2, plugin_pb2_grpc
from .context import Context
from .errors import BadInput, NotFound, PluginError, Transient, from_exception
from .host import HostClient
from .provider import Applied, Diagnostic, Found, Resource, ResourceState
from .schema import fill_defaults, missing_required, object_schema, sensitive_field_paths
from .values import (
    UNKNOWN,
    contains_unknown,
    from_value,
    kind_name,
    mark_sensitive,
    sensitive_paths,
    to_value,
)

PROTOCOL_VERSION = 1
log = logging.getLogger("trellis_plugin")


class Declaration:
    """The provider's declaration, checked once at startup: the manifest (constant, so the
    engine may cache it), the capabilities, and lookups by type and name."""

    def __init__(self, provider):
        if not provider.name or "/" in provider.name:
            raise ValueError("Provider.name must be set to the namespace (`kv` for `kv/entry`)")
        self.provider = provider
        self.resources = {}
        for r in provider.resource_types():
            if not r.type_name.startswith(provider.name + "/"):
                raise ValueError(f"resource type `{r.type_name}` is not in namespace `{provider.name}`")
            if r.type_name in self.resources:
                raise ValueError(f"resource type `{r.type_name}` is declared twice")
            self.resources[r.type_name] = r
        self.functions = {}
        for f in provider.function_defs():
            if f.name in self.functions:
                raise ValueError(f"function `{f.name}` is declared twice")
            self.functions[f.name] = f
        info = plugin_pb2.PluginInfo(kind=plugin_pb2.PLUGIN_KIND_PROVIDER, name=provider.name,
                                     version=provider.version)
        self.manifest = plugin_pb2.Manifest(
            plugin=info,
            resource_types=[
                plugin_pb2.ResourceTypeDef(
                    type=r.type_name, description=r.description,
                    spec_schema=object_schema(r.fields, r.description),
                    importable=_importable(r),
                )
                for r in self.resources.values()
            ],
            functions=[f.to_proto() for f in self.functions.values()],
            retry_policy=provider.retry_policy,
            config_schema=object_schema(provider.config),
        )
        self.capabilities = plugin_pb2.Capabilities(
            # Python can see whether a method was overridden, so nobody has to say it.
            read_resource=any(type(r).read is not Resource.read for r in self.resources.values()),
            import_resource=any(_importable(r) for r in self.resources.values()),
            functions=bool(self.functions),
            # Every call's ctx.cancelled follows Cancel.
            cancel=True,
            # DestroyResources runs each item through its resource's destroy.
            destroy_resources=True,
        )


class Calls:
    """The calls in flight, so Cancel and shutdown can reach their contexts."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls = []
        self._closed = False

    def add(self, ctx):
        """Registers `ctx`; False once the plugin is shutting down (see `close`)."""
        with self._lock:
            if self._closed:
                return False
            self._calls.append(ctx)
            return True

    def close(self):
        """Refuses calls from now on: the plugin is shutting down."""
        with self._lock:
            self._closed = True

    def remove(self, ctx):
        with self._lock:
            self._calls.remove(ctx)

    def cancel(self, call_id):
        with self._lock:
            found = [c for c in self._calls if call_id and c.call_id == call_id]
        for c in found:
            c.cancel()
        return bool(found)

    def cancel_all(self):
        with self._lock:
            calls = list(self._calls)
        for c in calls:
            c.cancel()

    def __len__(self):
        with self._lock:
            return len(self._calls)


class PluginService(plugin_pb2_grpc.PluginServicer):
    def __init__(self, decl, nonce, shared):
        self._decl = decl
        self._nonce = nonce
        self._shared = shared

    def Handshake(self, request, context):
        # Constant-time: the nonce is what keeps other local processes out.
        if not hmac.compare_digest(request.nonce.encode(), self._nonce.encode()):
            log.warning("handshake refused: wrong nonce")
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the nonce does not match")
        if PROTOCOL_VERSION not in request.protocol_versions:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no common protocol version: the engine offers {list(request.protocol_versions)}, "
                f"this plugin speaks {PROTOCOL_VERSION}",
            )
        if request.host_address:
            # A new handshake may bring a new token. The old client is left to the garbage
            # collector, not closed: calls in flight may still be using it.
            self._shared["host"] = HostClient(request.host_address, request.host_token)
        log.info("handshake ok")
        return plugin_pb2.HandshakeResponse(
            protocol_version=PROTOCOL_VERSION,
            plugin=self._decl.manifest.plugin,
            capabilities=self._decl.capabilities,
        )

    def GetManifest(self, request, context):
        return self._decl.manifest


def _importable(r):
    return type(r).import_resource is not Resource.import_resource


def _state_of(rs):
    """A protocol ResourceState as the SDK's."""
    spec = from_value(rs.spec)
    state = from_value(rs.state)
    return ResourceState(
        rs.resource_type, rs.resource_name, rs.external_id,
        spec if isinstance(spec, dict) else {}, state if isinstance(state, dict) else {},
    )


def _marked(obj, paths):
    v = to_value(obj if obj is not None else {})
    return mark_sensitive(v, paths)


class ProviderService(plugin_pb2_grpc.ProviderServicer):
    # RPCs not defined here (PlanResource, data sources, links, ...) answer UNIMPLEMENTED:
    # the capabilities do not declare them, so the engine does not call them.

    def __init__(self, decl, calls, shared):
        self._decl = decl
        self._provider = decl.provider
        self._calls = calls
        self._shared = shared
        self._shared_lock = threading.Lock()
        self._logger = logging.getLogger(self._provider.name)

    # ------------------------------------------------------------ plumbing

    def _context(self, cc, grpc_context, input_value=None):
        host = self._shared.get("host")
        ctx = Context.from_call(
            cc, config_fields=self._provider.config, logger=self._logger,
            host=host.bound(cc.instance_id) if host else None, input_value=input_value,
        )
        if grpc_context is not None:
            # Runs when the RPC ends for any reason, the engine dropping it included.
            grpc_context.add_callback(ctx.cancel)
        return ctx

    def _run(self, rpc, what, ctx, fn):
        """fn(ctx) with the call registered and logged; (result, None) or (None, PluginError)."""
        if not self._calls.add(ctx):
            # Worth retrying: the engine starts the plugin again.
            return None, Transient(f"{rpc} {what}".strip() + ": the plugin is shutting down")
        started = time.monotonic()
        err = None
        try:
            return fn(ctx), None
        except (Exception, SystemExit) as e:  # noqa: BLE001: a callback's bugs are answered
            err = from_exception(e, f"{rpc} {what}".strip())
            if not isinstance(e, PluginError):
                # The traceback is for the author; the engine gets only the class and type.
                ctx.log.exception("%s %s failed", rpc, what)
            return None, err
        finally:
            self._calls.remove(ctx)
            ms = (time.monotonic() - started) * 1000
            # Never values in log lines: they may be secret.
            if err is None:
                # Changes are worth a line each; checks and reads only when debugging.
                level = logging.INFO if rpc in ("ApplyResource", "DestroyResource") else logging.DEBUG
                ctx.log.log(level, "%s %s: ok in %.0f ms", rpc, what, ms)
            else:
                ctx.log.warning("%s %s: %s %s (%.0f ms)", rpc, what, err.class_name, err.message, ms)

    def _resource(self, type_name):
        r = self._decl.resources.get(type_name)
        if r is None:
            raise BadInput(f"`{self._provider.name}` has no resource type `{type_name}`")
        return r

    def _spec(self, resource, value):
        spec = from_value(value)
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise BadInput("the spec must be a map")
        return fill_defaults(resource.fields, spec)

    @staticmethod
    def _diagnostics(found):
        diags = []
        for d in found or []:
            if not isinstance(d, Diagnostic):
                raise TypeError("validation must return a list of Diagnostic")
            diags.append(d.to_proto())
        return diags

    def _validate_answer(self, result, err):
        if err is not None:
            code = "plugin." + err.class_name.lower().replace("_", "-")
            return plugin_pb2.ValidateResponse(
                diagnostics=[Diagnostic.error(code, err.message, err.path).to_proto()]
            )
        return plugin_pb2.ValidateResponse(diagnostics=result)

    # ------------------------------------------------------------ RPCs

    def ValidateConfig(self, request, context):
        ctx = self._context(request.context, context, request.context.provider_config)
        result, err = self._run(
            "ValidateConfig", "", ctx,
            lambda c: self._diagnostics(self._provider.validate_config(c)),
        )
        return self._validate_answer(result, err)

    def ValidateResource(self, request, context):
        ctx = self._context(request.context, context, request.spec)

        def validate(c):
            r = self._resource(request.resource_type)
            return self._diagnostics(r.validate(c, self._spec(r, request.spec)))

        result, err = self._run("ValidateResource", request.resource_name, ctx, validate)
        return self._validate_answer(result, err)

    def ApplyResource(self, request, context):
        ctx = self._context(request.context, context, request.desired_spec)
        events = queue.Queue()

        def progress(message, fraction):
            f = -1.0 if fraction is None else min(1.0, max(0.0, float(fraction)))
            events.put(plugin_pb2.ApplyResourceEvent(
                progress=plugin_pb2.Progress(message=str(message), fraction=f)))

        ctx._progress = progress

        def apply(c):
            r = self._resource(request.resource_type)
            spec = self._spec(r, request.desired_spec)
            missing = missing_required(r.fields, spec)
            if missing is not None:
                raise BadInput(f"{missing} is required", missing)
            current = _state_of(request.current) if request.HasField("current") else None
            applied = r.apply(c, spec, current)
            if not isinstance(applied, Applied):
                raise TypeError(f"{r.type_name}: apply must return Applied")
            external_id = applied.external_id or (current.external_id if current else "")
            state = _marked(applied.state, sensitive_field_paths(r.fields))
            return plugin_pb2.ApplyResult(external_id=external_id, state=state)

        def work():
            result, err = None, None
            try:
                result, err = self._run("ApplyResource", request.resource_name, ctx, apply)
            finally:
                # Whatever happened, the stream below gets its one result.
                if result is None and err is None:
                    err = from_exception(RuntimeError(), "ApplyResource")
                try:
                    out = answer(result, err)
                except Exception:  # noqa: BLE001
                    log.exception("ApplyResource %s: cannot build the answer", request.resource_name)
                    out = plugin_pb2.ApplyResult(error=from_exception(RuntimeError(), "ApplyResource").to_proto())
                events.put(out)

        def answer(result, err):
            if err is not None:
                r = self._decl.resources.get(request.resource_type)
                paths = sensitive_field_paths(r.fields) if r else []
                result = plugin_pb2.ApplyResult(external_id=err.external_id or "")
                e = err.to_proto()
                if err.partial_state is not None:
                    mark_sensitive(e.partial_state, paths)
                    result.state.CopyFrom(e.partial_state)
                result.error.CopyFrom(e)
            return result

        # The callback runs on its own thread, so this one can stream its progress events
        # while it works.
        threading.Thread(target=work, name=f"apply-{ctx.call_id}", daemon=True).start()
        while True:
            try:
                item = events.get(timeout=0.2)
            except queue.Empty:
                if not context.is_active():
                    return  # the engine dropped the call; ctx is cancelled
                continue
            if isinstance(item, plugin_pb2.ApplyResult):
                yield plugin_pb2.ApplyResourceEvent(result=item)
                return
            yield item

    def DestroyResource(self, request, context):
        ctx = self._context(request.context, context, request.current.spec)

        def destroy(c):
            r = self._resource(request.current.resource_type)
            r.destroy(c, _state_of(request.current))

        _, err = self._run("DestroyResource", request.current.resource_name, ctx, destroy)
        resp = plugin_pb2.DestroyResourceResponse()
        if err is not None:
            resp.error.CopyFrom(err.to_proto())
        return resp

    def DestroyResources(self, request, context):
        """Each item as DestroyResource would run it, with its own key, on a thread of the
        items' pool; each outcome is sent as it finishes. The items share the call's id, so a
        Cancel of it reaches them all, as does the engine dropping the call."""
        answers = queue.Queue()

        def one(index, item):
            event = plugin_pb2.DestroyResourcesEvent(index=index)
            try:
                cc = type(request.context)()
                cc.CopyFrom(request.context)
                cc.idempotency_key = item.idempotency_key
                ctx = self._context(cc, context, item.current.spec)

                def destroy(c):
                    r = self._resource(item.current.resource_type)
                    r.destroy(c, _state_of(item.current))

                _, err = self._run("DestroyResource", item.current.resource_name, ctx, destroy)
            except Exception as e:  # noqa: BLE001: every item gets an answer
                err = from_exception(e, "DestroyResources")
            if err is not None:
                event.error.CopyFrom(err.to_proto())
            answers.put(event)

        log.info("DestroyResources: %d items", len(request.items))
        pool = self._item_pool()
        for index, item in enumerate(request.items):
            pool.submit(one, index, item)
        for _ in request.items:
            while True:
                try:
                    yield answers.get(timeout=0.5)
                    break
                except queue.Empty:
                    if not context.is_active():
                        return  # the engine dropped the call; its items are cancelled

    def _item_pool(self):
        """The threads DestroyResources items run on, made on first use."""
        with self._shared_lock:
            pool = self._shared.get("items")
            if pool is None:
                pool = futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="item")
                self._shared["items"] = pool
            return pool

    def ReadResource(self, request, context):
        cur = request.current
        ctx = self._context(request.context, context, cur.spec)

        def read(c):
            r = self._resource(cur.resource_type)
            current = _state_of(cur)
            if type(r).read is Resource.read:
                # Another resource type declared read_resource, not this one: nothing to
                # compare with, so report what the engine knows (no drift).
                return plugin_pb2.ReadResourceResponse(exists=True, spec=cur.spec, state=cur.state)
            found = r.read(c, current)
            if found is None:
                return plugin_pb2.ReadResourceResponse(exists=False)
            if not isinstance(found, Found):
                raise TypeError(f"{r.type_name}: read must return Found or None")
            declared = sensitive_field_paths(r.fields)
            # What was secret when applied is still secret when read back.
            spec = _marked(found.spec, declared + sensitive_paths(cur.spec))
            state = _marked(found.state, declared + sensitive_paths(cur.state))
            return plugin_pb2.ReadResourceResponse(
                exists=True, spec=spec, state=state, external_id=found.external_id
            )

        result, err = self._run("ReadResource", cur.resource_name, ctx, read)
        if err is not None:
            return plugin_pb2.ReadResourceResponse(error=err.to_proto())
        return result

    def ImportResource(self, request, context):
        ctx = self._context(request.context, context)

        def find(c):
            r = self._resource(request.resource_type)
            if not _importable(r):
                raise BadInput(f"{r.type_name} cannot be imported (the type is not declared importable)")
            found = r.import_resource(c, request.external_id, request.resource_name)
            if found is None:
                return plugin_pb2.ImportResourceResponse(exists=False)
            if not isinstance(found, Found):
                raise TypeError(f"{r.type_name}: import_resource must return Found or None")
            declared = sensitive_field_paths(r.fields)
            return plugin_pb2.ImportResourceResponse(
                exists=True, spec=_marked(found.spec, declared), state=_marked(found.state, declared),
                external_id=found.external_id or request.external_id,
            )

        result, err = self._run("ImportResource", request.resource_name, ctx, find)
        if err is not None:
            return plugin_pb2.ImportResourceResponse(error=err.to_proto())
        return result

    def CallFunction(self, request, context):
        args = list(request.args)
        sensitive = [(i, *p) for i, a in enumerate(args) for p in sensitive_paths(a)]
        ctx = self._context(request.context, context)
        ctx._sensitive = sensitive

        def call(c):
            f = self._decl.functions.get(request.name)
            if f is None:
                raise NotFound(f"`{self._provider.name}` has no function `{request.name}`")
            values = [from_value(a) for a in args]
            _check_args(f, values)
            if any(contains_unknown(v) for v in values):
                return UNKNOWN  # known only after deploy, like its argument
            values += [None] * (len(f.params) - len(values))  # missing optional ones
            # Through the instance, so a subclass's override is the one called.
            return getattr(self._provider, f.method.__name__)(c, *values)

        result, err = self._run("CallFunction", request.name, ctx, call)
        if err is not None:
            return plugin_pb2.CallFunctionResponse(error=err.to_proto())
        try:
            # A result derived from a secret is a secret.
            value = to_value(result, sensitive=bool(sensitive))
        except (TypeError, ValueError) as e:
            log.error("CallFunction %s: the result is not a value: %s", request.name, e)
            return plugin_pb2.CallFunctionResponse(
                error=from_exception(e, f"CallFunction {request.name}").to_proto())
        return plugin_pb2.CallFunctionResponse(result=value)

    def Cancel(self, request, context):
        found = self._calls.cancel(request.call_id)
        log.info("cancel %s: %s", request.call_id or "-", "cancelling" if found else "no such call")
        return plugin_pb2.CancelResponse(cancelled=found)


def _check_args(f, values):
    """The argument count and types against the declaration: BAD_INPUT at [index N]."""
    required = sum(1 for p in f.params if not p.optional)
    if len(values) < required:
        raise BadInput(f"{f.name} takes at least {required} argument(s), got {len(values)}")
    if len(values) > len(f.params) and f.variadic is None:
        raise BadInput(
            f"{f.name} takes at most {len(f.params)} argument(s), got {len(values)}", [len(f.params)]
        )
    for i, v in enumerate(values):
        p = f.params[i] if i < len(f.params) else f.variadic
        if v is UNKNOWN:
            continue
        if v is None:
            if p.optional:
                continue
            raise BadInput(f"{f.name}: argument {i} ({p.name}) is required", [i])
        if not p.type.accepts(v):
            raise BadInput(
                f"{f.name} expects {p.type.kind.lower()} for {p.name}, got {kind_name(v)}", [i]
            )

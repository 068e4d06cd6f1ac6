#!/usr/bin/env python3
"""pyecho: a minimal Trellis provider written in Python with grpcio.

It is built from proto/trellis/plugin/v1/*.proto alone (see
docs/plugin-protocol.md), to prove that the .proto files, not the Rust SDK,
are the plugin contract. The engine launches it through the
`bin/trellis-provider-pyecho` launcher like any other plugin.

Resource type `pyecho/message`:
  spec   text:     string, required
         repeat:   integer, default 1, 0..1000
         lookup:   string, optional: another resource of the instance, read through
                   the engine's Host service (LookupResource) when applying
         lookupInstance: string, optional test knob: ask about this instance id
                   instead of the call's own (the engine refuses)
  state  rendered: string (text repeated `repeat` times), computed
         id:       string, computed (also the external id)
         lookedUp: string, computed: the external id of `lookup` ("" if the
                   engine has no such resource)

Functions `upper(string) -> string`, and `host_upper(string) -> string`, the
same computed by the engine: it calls the core function `to_upper` through the
engine's Host service, over a stock grpcio channel (no channel options).

Provider config (all optional):
  stateDir      an absolute directory. When set, each message is also written
                to `<stateDir>/<id>.json`, so ReadResource can report drift (an
                edited file) and deletion (a removed file). Without it the
                provider derives everything from the request: plugins keep no
                state between calls.
  applyDelayMs  a test knob: ApplyResource waits this long after its progress
                event (stopping early if the call is cancelled), so tests can
                catch a call in flight.
  driftOnRead   a test knob: ReadResource reports `text` with a `!` added, the
                phantom drift `trellis plugins check` must catch.
"""

import functools
import hashlib
import hmac
import json
import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from trellis_interop import (
    UNKNOWN,
    attr_path,
    from_value,
    make_error,
    map_get,
    plugin_pb2,
    plugin_pb2_grpc,
    to_value,
    types_pb2,
)

PROTOCOL_VERSION = 1
NAMESPACE = "pyecho"
VERSION = "0.1.0"
RESOURCE_TYPE = "pyecho/message"
MAX_REPEAT = 1000
SOCKET_NAME = "pyecho.sock"
# gRPC's default receive limit is 4 MiB; blueprints and data source answers can be larger.
MAX_MESSAGE_BYTES = 64 << 20
# On SIGTERM, in-flight calls get this long to finish before they are
# cancelled: less than the engine's grace before SIGKILL, so that calls are
# answered and the socket is removed.
SHUTDOWN_GRACE_SECONDS = 4.0
# After a SIGTERM drain, the socket stays open this long: the last answer may
# still be on the way, and a client that writes to a closed socket fails the
# call (grpcio: UNAVAILABLE "Stream removed (sendmsg: Broken pipe)").
LINGER_SECONDS = 0.2

log = logging.getLogger(NAMESPACE)


# ---------------------------------------------------------------- manifest


def _field(name, schema, **flags):
    return plugin_pb2.SchemaField(name=name, schema=schema, **flags)


def _schema(type_, description="", **kw):
    return plugin_pb2.Schema(type=type_, description=description, **kw)


def build_manifest():
    """Everything static. Built from constants only, so it is the same for every
    run of the same code: the engine caches it by the plugin binary's hash."""
    info = plugin_pb2.PluginInfo(kind=plugin_pb2.PLUGIN_KIND_PROVIDER, name=NAMESPACE, version=VERSION)
    spec = _schema(
        plugin_pb2.SCHEMA_TYPE_OBJECT,
        "A message rendered by repeating its text.",
        fields=[
            _field("text", _schema(plugin_pb2.SCHEMA_TYPE_STRING, "The text to repeat."), required=True),
            _field(
                "repeat",
                _schema(
                    plugin_pb2.SCHEMA_TYPE_INTEGER,
                    f"How many times to repeat the text (0..{MAX_REPEAT}).",
                    default=to_value(1),
                ),
            ),
            _field(
                "rendered",
                _schema(plugin_pb2.SCHEMA_TYPE_STRING, "The text repeated `repeat` times."),
                computed=True,
            ),
            _field("id", _schema(plugin_pb2.SCHEMA_TYPE_STRING, "The message's id."), computed=True),
            _field(
                "lookup",
                _schema(
                    plugin_pb2.SCHEMA_TYPE_STRING,
                    "Another resource of the instance whose external id becomes `lookedUp`, "
                    "read through the engine's Host service.",
                ),
            ),
            _field(
                "lookupInstance",
                _schema(
                    plugin_pb2.SCHEMA_TYPE_STRING,
                    "Test knob: the instance id to ask about instead of the call's own.",
                ),
            ),
            _field(
                "lookedUp",
                _schema(plugin_pb2.SCHEMA_TYPE_STRING, "The external id of `lookup` (\"\" if none)."),
                computed=True,
            ),
        ],
    )
    config = _schema(
        plugin_pb2.SCHEMA_TYPE_OBJECT,
        "pyecho provider configuration.",
        fields=[
            _field(
                "stateDir",
                _schema(
                    plugin_pb2.SCHEMA_TYPE_STRING,
                    "Absolute directory where messages are also written as files (optional).",
                ),
            ),
            _field(
                "applyDelayMs",
                _schema(
                    plugin_pb2.SCHEMA_TYPE_INTEGER,
                    "Test knob: milliseconds ApplyResource waits after its progress event.",
                ),
            ),
            _field(
                "driftOnRead",
                _schema(
                    plugin_pb2.SCHEMA_TYPE_BOOLEAN,
                    "Test knob: ReadResource reports `text` with a `!` added (phantom drift, "
                    "for `trellis plugins check`).",
                ),
            ),
        ],
    )
    return plugin_pb2.Manifest(
        plugin=info,
        resource_types=[
            plugin_pb2.ResourceTypeDef(
                type=RESOURCE_TYPE, description="A repeated text.", spec_schema=spec
            )
        ],
        functions=[
            plugin_pb2.FunctionDef(
                name="upper",
                description="The string in upper case.",
                params=[plugin_pb2.FunctionParam(name="s", type=plugin_pb2.SCHEMA_TYPE_STRING)],
                returns=plugin_pb2.SCHEMA_TYPE_STRING,
            ),
            plugin_pb2.FunctionDef(
                name="host_upper",
                description="The string in upper case, from the engine's Host service.",
                params=[plugin_pb2.FunctionParam(name="s", type=plugin_pb2.SCHEMA_TYPE_STRING)],
                returns=plugin_pb2.SCHEMA_TYPE_STRING,
            ),
            plugin_pb2.FunctionDef(
                name="engine_capabilities",
                description="The engine's capabilities from the handshake, joined by `s`.",
                params=[plugin_pb2.FunctionParam(name="s", type=plugin_pb2.SCHEMA_TYPE_STRING)],
                returns=plugin_pb2.SCHEMA_TYPE_STRING,
            ),
        ],
        retry_policy=plugin_pb2.RetryPolicy(
            max_attempts=3, initial_backoff_ms=100, max_backoff_ms=2000, multiplier=2.0
        ),
        config_schema=config,
    )


MANIFEST = build_manifest()
CAPABILITIES = plugin_pb2.Capabilities(read_resource=True, functions=True)


# ---------------------------------------------------------------- helpers


class BadInput(Exception):
    def __init__(self, message, path=None):
        super().__init__(message)
        self.path = path


def state_dir(ctx):
    """`stateDir` from CallContext.provider_config, or None."""
    v = map_get(ctx.provider_config, "stateDir")
    d = from_value(v)
    if d is None:
        return None
    if not isinstance(d, str) or not os.path.isabs(d):
        raise BadInput("stateDir must be an absolute path", attr_path("stateDir"))
    return d


def apply_delay_ms(ctx):
    d = from_value(map_get(ctx.provider_config, "applyDelayMs"))
    if d is None:
        return 0
    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
        raise BadInput("applyDelayMs must be a non-negative integer", attr_path("applyDelayMs"))
    return d


def message_id(instance_id, resource_name):
    """Derived from the request alone, so a retried create (same idempotency
    key, same instance and name) finds the same message instead of a second one."""
    digest = hashlib.sha256(f"{instance_id}\0{resource_name}".encode()).hexdigest()
    return f"msg-{digest[:16]}"


def read_spec(spec):
    """(text Value, repeat int) from a known spec; BadInput with the field's path otherwise."""
    if spec is None or spec.WhichOneof("kind") != "map":
        raise BadInput("the spec must be a map")
    text = map_get(spec, "text")
    if text is None or text.WhichOneof("kind") in (None, "null"):
        raise BadInput("text is required", attr_path("text"))
    if text.WhichOneof("kind") != "string":
        raise BadInput("text must be a string", attr_path("text"))
    repeat_v = map_get(spec, "repeat")
    repeat = from_value(repeat_v)
    if repeat is None:
        repeat = 1  # the schema default, in case the engine did not fill it in
    if repeat is UNKNOWN:
        raise BadInput("repeat is not known yet", attr_path("repeat"))
    if isinstance(repeat, bool) or not isinstance(repeat, int):
        raise BadInput("repeat must be an integer", attr_path("repeat"))
    if not 0 <= repeat <= MAX_REPEAT:
        raise BadInput(f"repeat must be between 0 and {MAX_REPEAT}", attr_path("repeat"))
    return text, repeat


def render(text, repeat):
    """The computed state, a MAP value; `rendered` is as sensitive as `text`."""
    return {"rendered": to_value(text.string * repeat, sensitive=text.sensitive)}


def state_value(ext_id, text, repeat, looked_up=None):
    state = {"id": ext_id, **render(text, repeat)}
    if looked_up is not None:
        state["lookedUp"] = to_value(looked_up)
    return to_value(state)


def looked_up_of(state):
    """`lookedUp` of a recorded state (kept by reads: only an apply asks the engine)."""
    v = from_value(map_get(state, "lookedUp")) if state is not None else None
    return v if isinstance(v, str) else None


def message_file(directory, ext_id):
    return os.path.join(directory, ext_id + ".json")


def write_message(directory, ext_id, text, repeat):
    os.makedirs(directory, exist_ok=True)
    path = message_file(directory, ext_id)
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"text": text.string, "repeat": repeat, "rendered": text.string * repeat}, f)
    os.replace(tmp, path)


def internal_errors(response_type):
    """An unexpected exception becomes an INTERNAL application error in the
    response (gRPC status codes are for transport failures only)."""

    def wrap(method):
        @functools.wraps(method)
        def unary(self, request, context):
            try:
                return method(self, request, context)
            except Exception as e:  # noqa: BLE001
                log.exception("%s failed", method.__name__)
                return response_type(
                    error=make_error(types_pb2.ERROR_CLASS_INTERNAL, f"{type(e).__name__} in {method.__name__}")
                )

        return unary

    return wrap


def call_label(ctx):
    # Never log values: they may be sensitive.
    return f"call {ctx.call_id or '-'} instance {ctx.instance_id or '-'}"


# ---------------------------------------------------------------- services


class HostLink:
    """Where the engine's Host service is, from the handshake (the token is never logged)."""

    def __init__(self):
        self.address = ""
        self.token = ""
        self.engine = plugin_pb2.EngineCapabilities()


class PluginService(plugin_pb2_grpc.PluginServicer):
    def __init__(self, nonce, host):
        self._nonce = nonce
        self._host = host

    def Handshake(self, request, context):
        if not hmac.compare_digest(request.nonce.encode(), self._nonce.encode()):
            log.warning("handshake rejected: wrong nonce")
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "nonce does not match")
        if PROTOCOL_VERSION not in request.protocol_versions:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no common protocol version: engine offers {list(request.protocol_versions)}, "
                f"plugin speaks [{PROTOCOL_VERSION}]",
            )
        self._host.address = request.host_address
        self._host.token = request.host_token
        self._host.engine = request.engine_capabilities
        log.info("handshake ok (host service at %s)", request.host_address or "-")
        return plugin_pb2.HandshakeResponse(
            protocol_version=PROTOCOL_VERSION, plugin=MANIFEST.plugin, capabilities=CAPABILITIES
        )

    def GetManifest(self, request, context):
        return MANIFEST


class ProviderService(plugin_pb2_grpc.ProviderServicer):
    # Methods not overridden (PlanResource, FetchDataSource, links, Cancel, ...)
    # answer UNIMPLEMENTED; Capabilities says the engine will not call them.

    def __init__(self, host):
        self._host = host

    def ValidateConfig(self, request, context):
        diags = []
        try:
            state_dir(request.context)
            apply_delay_ms(request.context)
        except BadInput as e:
            diags.append(_diag(types_pb2.SEVERITY_ERROR, "pyecho.bad-config", str(e), e.path))
        return plugin_pb2.ValidateResponse(diagnostics=diags)

    def ValidateResource(self, request, context):
        # The engine has checked the schema (types, required, allowed values);
        # this is what the schema cannot say. Unknown values are not checked.
        diags = []
        if request.resource_type != RESOURCE_TYPE:
            diags.append(
                _diag(types_pb2.SEVERITY_ERROR, "pyecho.unknown-type", f"unknown type {request.resource_type}")
            )
            return plugin_pb2.ValidateResponse(diagnostics=diags)
        repeat = from_value(map_get(request.spec, "repeat"))
        if isinstance(repeat, int) and not isinstance(repeat, bool):
            if not 0 <= repeat <= MAX_REPEAT:
                diags.append(
                    _diag(
                        types_pb2.SEVERITY_ERROR,
                        "pyecho.repeat-range",
                        f"repeat is {repeat}, but must be between 0 and {MAX_REPEAT}",
                        attr_path("repeat"),
                        hint="use a smaller repeat",
                    )
                )
        if from_value(map_get(request.spec, "text")) == "":
            diags.append(
                _diag(types_pb2.SEVERITY_WARNING, "pyecho.empty-text", "text is empty", attr_path("text"))
            )
        return plugin_pb2.ValidateResponse(diagnostics=diags)

    def ApplyResource(self, request, context):
        try:
            yield from self._apply(request, context)
        except Exception as e:  # noqa: BLE001
            log.exception("ApplyResource failed")
            yield _result(
                error=make_error(types_pb2.ERROR_CLASS_INTERNAL, f"{type(e).__name__} in ApplyResource")
            )

    def _apply(self, request, context):
        ctx = request.context
        creating = not request.HasField("current")
        log.info(
            "%s: %s %s %s",
            call_label(ctx),
            "create" if creating else "update",
            request.resource_type,
            request.resource_name,
        )
        try:
            if request.resource_type != RESOURCE_TYPE:
                raise BadInput(f"unknown resource type {request.resource_type}")
            text, repeat = read_spec(request.desired_spec)
            directory = state_dir(ctx)
            delay_ms = apply_delay_ms(ctx)
        except BadInput as e:
            yield _result(error=make_error(types_pb2.ERROR_CLASS_BAD_INPUT, str(e), e.path))
            return
        ext_id = (
            request.current.external_id
            if not creating and request.current.external_id
            else message_id(ctx.instance_id, request.resource_name)
        )
        yield plugin_pb2.ApplyResourceEvent(
            progress=plugin_pb2.Progress(message=f"rendering {request.resource_name}", fraction=0.5)
        )
        looked_up = None
        lookup = from_value(map_get(request.desired_spec, "lookup"))
        if isinstance(lookup, str) and lookup:
            instance = from_value(map_get(request.desired_spec, "lookupInstance")) or ctx.instance_id
            looked_up, error = self._lookup(instance, lookup)
            if error is not None:
                yield _result(error=error)
                return
        end = time.monotonic() + delay_ms / 1000
        while context.is_active() and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        if not context.is_active():
            log.info("%s: cancelled", call_label(ctx))
            return
        if ctx.deadline_unix_ms and time.time() * 1000 > ctx.deadline_unix_ms:
            yield _result(error=make_error(types_pb2.ERROR_CLASS_TRANSIENT, "deadline passed before writing"))
            return
        if directory is not None:
            try:
                write_message(directory, ext_id, text, repeat)
            except OSError as e:
                yield _result(
                    error=make_error(types_pb2.ERROR_CLASS_INTERNAL, f"cannot write message: {e.strerror}")
                )
                return
        yield _result(external_id=ext_id, state=state_value(ext_id, text, repeat, looked_up))

    def _lookup(self, instance_id, name):
        """(external id or "", None), or (None, Error): Host.LookupResource on a stock channel."""
        if not self._host.address:
            return None, make_error(types_pb2.ERROR_CLASS_INTERNAL, "no Host service address")
        with grpc.insecure_channel(self._host.address) as channel:
            try:
                resp = plugin_pb2_grpc.HostStub(channel).LookupResource(
                    plugin_pb2.LookupResourceRequest(instance_id=instance_id, resource_name=name),
                    metadata=[("x-trellis-host-token", self._host.token)],
                    timeout=30,
                )
            except grpc.RpcError as e:
                return None, make_error(
                    types_pb2.ERROR_CLASS_INTERNAL, f"Host.LookupResource: {e.code().name}: {e.details()}"
                )
        return (resp.resource.external_id if resp.found else ""), None

    @internal_errors(plugin_pb2.DestroyResourceResponse)
    def DestroyResource(self, request, context):
        ctx = request.context
        log.info("%s: destroy %s", call_label(ctx), request.current.resource_name)
        try:
            directory = state_dir(ctx)
        except BadInput as e:
            return plugin_pb2.DestroyResourceResponse(
                error=make_error(types_pb2.ERROR_CLASS_BAD_INPUT, str(e), e.path)
            )
        if directory is not None and request.current.external_id:
            try:
                os.remove(message_file(directory, request.current.external_id))
            except FileNotFoundError:
                pass  # already gone: destroying twice is not an error
            except OSError as e:
                return plugin_pb2.DestroyResourceResponse(
                    error=make_error(types_pb2.ERROR_CLASS_INTERNAL, f"cannot remove message: {e.strerror}")
                )
        return plugin_pb2.DestroyResourceResponse()

    @internal_errors(plugin_pb2.ReadResourceResponse)
    def ReadResource(self, request, context):
        response = self._read(request)
        if from_value(map_get(request.context.provider_config, "driftOnRead")) is True and (
            response.exists
        ):
            text = map_get(response.spec, "text")
            if text is not None and text.WhichOneof("kind") == "string":
                text.string += "!"
        return response

    def _read(self, request):
        ctx = request.context
        cur = request.current
        try:
            directory = state_dir(ctx)
            if directory is None:
                # Nothing outside the engine's state to compare with.
                text, repeat = read_spec(cur.spec)
                return plugin_pb2.ReadResourceResponse(
                    exists=True,
                    spec=cur.spec,
                    state=state_value(cur.external_id, text, repeat, looked_up_of(cur.state)),
                )
            try:
                with open(message_file(directory, cur.external_id), encoding="utf-8") as f:
                    data = json.load(f)
            except FileNotFoundError:
                return plugin_pb2.ReadResourceResponse(exists=False)
            old_text = map_get(cur.spec, "text")
            sensitive = bool(old_text is not None and old_text.sensitive)
            text = to_value(str(data.get("text", "")), sensitive=sensitive)
            repeat = data.get("repeat", 1)
            fields = {"text": text, "repeat": repeat}
            for key in ("lookup", "lookupInstance"):
                if map_get(cur.spec, key) is not None:
                    fields[key] = map_get(cur.spec, key)
            spec = to_value(fields)
            return plugin_pb2.ReadResourceResponse(
                exists=True,
                spec=spec,
                state=state_value(cur.external_id, text, repeat, looked_up_of(cur.state)),
            )
        except BadInput as e:
            return plugin_pb2.ReadResourceResponse(
                error=make_error(types_pb2.ERROR_CLASS_BAD_INPUT, str(e), e.path)
            )
        except (OSError, ValueError) as e:
            return plugin_pb2.ReadResourceResponse(
                error=make_error(types_pb2.ERROR_CLASS_INTERNAL, f"cannot read message: {e}")
            )

    @internal_errors(plugin_pb2.CallFunctionResponse)
    def CallFunction(self, request, context):
        if request.name not in ("upper", "host_upper", "engine_capabilities"):
            return plugin_pb2.CallFunctionResponse(
                error=make_error(types_pb2.ERROR_CLASS_NOT_FOUND, f"pyecho has no function {request.name}")
            )
        if len(request.args) != 1:
            return plugin_pb2.CallFunctionResponse(
                error=make_error(
                    types_pb2.ERROR_CLASS_BAD_INPUT, f"{request.name} takes 1 argument, got {len(request.args)}"
                )
            )
        arg = request.args[0]
        kind = arg.WhichOneof("kind")
        if kind == "unknown":
            return plugin_pb2.CallFunctionResponse(
                result=to_value(UNKNOWN, sensitive=arg.sensitive)
            )
        if kind != "string":
            return plugin_pb2.CallFunctionResponse(
                error=make_error(
                    types_pb2.ERROR_CLASS_BAD_INPUT, f"{request.name} expects a string, got {kind}", attr_path(0)
                )
            )
        if request.name == "host_upper":
            return self._host_upper(arg)
        if request.name == "engine_capabilities":
            flags = [f.name for f, on in self._host.engine.ListFields() if on]
            return plugin_pb2.CallFunctionResponse(result=to_value(arg.string.join(flags)))
        return plugin_pb2.CallFunctionResponse(
            result=to_value(arg.string.upper(), sensitive=arg.sensitive)
        )

    def _host_upper(self, arg):
        if not self._host.address:
            return plugin_pb2.CallFunctionResponse(
                error=make_error(types_pb2.ERROR_CLASS_INTERNAL, "no Host service address")
            )
        # A stock channel on purpose: the engine must accept the `:authority` grpcio
        # sends on a Unix socket (docs/plugin-protocol.md, "The Host service").
        with grpc.insecure_channel(self._host.address) as channel:
            try:
                resp = plugin_pb2_grpc.HostStub(channel).CallFunction(
                    plugin_pb2.HostCallFunctionRequest(name="to_upper", args=[arg]),
                    metadata=[("x-trellis-host-token", self._host.token)],
                    timeout=30,
                )
            except grpc.RpcError as e:
                return plugin_pb2.CallFunctionResponse(
                    error=make_error(
                        types_pb2.ERROR_CLASS_INTERNAL, f"Host.CallFunction: {e.code().name}: {e.details()}"
                    )
                )
        return resp


def _diag(severity, code, message, path=None, hint=""):
    d = types_pb2.Diagnostic(severity=severity, code=code, message=message, hint=hint)
    if path is not None:
        d.path.CopyFrom(path)
    return d


def _result(external_id="", state=None, error=None):
    r = plugin_pb2.ApplyResult(external_id=external_id)
    if state is not None:
        r.state.CopyFrom(state)
    if error is not None:
        r.error.CopyFrom(error)
    return plugin_pb2.ApplyResourceEvent(result=r)


# ---------------------------------------------------------------- launch and lifetime


def fail(message):
    print(f"trellis-provider-pyecho: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def main():
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    nonce = os.environ.get("TRELLIS_PLUGIN_NONCE")
    versions = os.environ.get("TRELLIS_PLUGIN_PROTOCOL_VERSIONS")
    sock_dir = os.environ.get("TRELLIS_PLUGIN_SOCKET_DIR")
    if not nonce or not versions or not sock_dir:
        fail(
            "this is a Trellis plugin: the engine launches it (TRELLIS_PLUGIN_NONCE, "
            "TRELLIS_PLUGIN_PROTOCOL_VERSIONS and TRELLIS_PLUGIN_SOCKET_DIR must be set)"
        )
    offered = {v.strip() for v in versions.split(",")}
    if str(PROTOCOL_VERSION) not in offered:
        fail(f"the engine speaks protocol versions {versions}; this plugin speaks {PROTOCOL_VERSION}")

    sock = os.path.join(os.path.abspath(sock_dir), SOCKET_NAME)
    if len(os.fsencode(sock)) > 107:  # sun_path is 108 bytes with the NUL
        fail(f"socket path too long for a Unix socket: {sock}")
    try:
        os.unlink(sock)  # a stale socket from a killed earlier run
    except FileNotFoundError:
        pass

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    host = HostLink()
    plugin_pb2_grpc.add_PluginServicer_to_server(PluginService(nonce, host), server)
    plugin_pb2_grpc.add_ProviderServicer_to_server(ProviderService(host), server)
    health_service = health.HealthServicer()
    for name in ("", "trellis.plugin.v1.Plugin", "trellis.plugin.v1.Provider"):
        health_service.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    try:
        server.add_insecure_port("unix:" + sock)
    except RuntimeError as e:
        fail(f"cannot listen on {sock}: {e}")
    server.start()

    stop = threading.Event()
    why = []

    def on_signal(signum, _frame):
        why.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watch_stdin():
        # The engine holds the write end of our stdin; EOF means it is gone.
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        why.append("stdin closed")
        stop.set()

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()

    # The handshake line: protocol version, network, address. Exactly once, flushed.
    sys.stdout.write(f"TRELLIS_PLUGIN|{PROTOCOL_VERSION}|unix|{sock}\n")
    sys.stdout.flush()
    log.info("listening on %s", sock)

    while not stop.wait(1.0):
        pass
    log.info("stopping (%s)", why[0] if why else "?")
    health_service.enter_graceful_shutdown()
    # SIGTERM: let in-flight calls finish, then cancel them. stdin EOF: the
    # engine is gone and cannot receive any answer, so do not wait.
    grace = 0 if why and why[0] == "stdin closed" else SHUTDOWN_GRACE_SECONDS
    server.stop(grace).wait()
    if grace:
        time.sleep(LINGER_SECONDS)
    try:
        os.unlink(sock)
    except FileNotFoundError:
        pass
    logging.shutdown()
    # Handler threads cannot be killed in Python; do not let one that ignores
    # cancellation keep the process alive.
    os._exit(0)


if __name__ == "__main__":
    main()

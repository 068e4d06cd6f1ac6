#!/usr/bin/env python3
"""Tests of the Python plugin SDK (sdk/python, package trellis_plugin) and of `kv`, the
provider built on it (trellis_provider_kv.py, launched by bin/trellis-provider-kv).

- SDK units: value conversion both ways (unknown and sensitive included), paths, error
  classes, defaults, the apply stream and its context, Cancel, functions; in-process,
  through trellis_plugin.testing.Harness (the real gRPC services on a temporary socket).
- Launch and lifetime, with real processes: the handshake line, a 0600 socket, a wrong nonce
  refused, health, JSON log lines, stdin EOF, SIGTERM (with a call in flight), by hand.
- The engine: `trellis serve` with this directory as its plugin directory; the CLI deploys
  a kv/entry, `trellis drift` reports the file changed behind the engine's back, and
  `trellis destroy` removes it. The Rust binaries come from `cargo build` (a no-op when
  fresh; skipped with TRELLIS_TEST_PREBUILT=1) in target/debug or $CARGO_TARGET_DIR/debug.

Run: python3 tests/interop/python/test_kv.py  (prints `kv: N passed, M failed`)
"""

import json
import logging
import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SDK = os.path.join(ROOT, "sdk", "python")
sys.path.insert(0, SDK)
sys.path.insert(0, HERE)

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from trellis_plugin import (  # noqa: E402
    UNKNOWN,
    Any,
    Applied,
    BadInput,
    Conflict,
    Diagnostic,
    Field,
    Integer,
    Object,
    Param,
    Permission,
    Provider,
    Resource,
    Sensitive,
    String,
    Transient,
    from_path,
    from_value,
    function,
    plugin_pb2,
    plugin_pb2_grpc,
    reveal,
    to_path,
    to_value,
    types_pb2,
)
from trellis_plugin.testing import Harness  # noqa: E402
from trellis_provider_kv import KV  # noqa: E402

from plugin_process import (  # noqa: E402
    EXIT_TIMEOUT,
    RPC_TIMEOUT,
    PluginProcess,
    run_tests,
    rust_binaries,
)

# The in-process providers log their (deliberate) failures; keep them out of the test's output.
logging.getLogger().addHandler(logging.NullHandler())

LAUNCHER = os.path.join(HERE, "bin", "trellis-provider-kv")


def error_class(err):
    return err.error_class  # `class` is a Python keyword


# ---------------------------------------------------------------- a provider for the SDK tests


class Probe(Resource):
    """Does what its `mode` says, and reports what its context held."""

    type_name = "t/probe"
    fields = [
        Field("name", String, required=True),
        Field("mode", String, default="ok"),
        Field("count", Integer, default=2),
        Field("nested", Object(Field("depth", Integer, default=1))),
        Field("token", String, computed=True, sensitive=True),
        Field("seen", Any, computed=True),
    ]

    def validate(self, ctx, spec):
        if spec["mode"] == "raise":
            raise Conflict("not now", "mode")
        if spec["mode"] == "crash":
            raise ZeroDivisionError("s3cret")
        if spec["name"] is UNKNOWN:
            return [Diagnostic.info("t.later", "name is known only at deploy", "name")]
        return []

    def apply(self, ctx, spec, current):
        mode = spec["mode"]
        ctx.progress("one", 0.25)
        ctx.progress("two")
        if mode == "bad":
            raise BadInput("depth is wrong", ["nested", "depth"])
        if mode == "partial":
            raise Transient("half done", external_id="p-1", partial_state={"token": "t0"})
        if mode == "crash":
            raise ValueError("s3cret")
        if mode == "oserror":
            open("/nonexistent-dir/x")
        if mode == "wait":
            ctx.sleep(30)  # raises Cancelled when the call is cancelled
        seen = {
            "call_id": ctx.call_id, "instance_id": ctx.instance_id,
            "request_id": ctx.request_id, "key": ctx.idempotency_key,
            "deadline_left": round(ctx.time_left()), "config": ctx.config,
            "count": spec["count"], "depth": spec["nested"]["depth"],
            "name_sensitive": ctx.is_sensitive("name"), "created": current is None,
        }
        return Applied("id-" + spec["name"], {"token": "tok", "seen": seen})

    destroyed_keys = []

    def destroy(self, ctx, current):
        Probe.destroyed_keys.append(ctx.idempotency_key)
        if current.spec.get("mode") == "deny":
            raise Permission("not allowed")
        if current.spec.get("mode") == "wait":
            ctx.sleep(30)  # raises Cancelled when the call is cancelled


class T(Provider):
    name = "t"
    version = "1.2.3"
    config = [Field("region", String, default="eu")]
    resources = [Probe]

    @function(params=[Param("s", String), Param("times", Integer, optional=True)], returns=String)
    def rep(self, ctx, s, times):
        """s repeated."""
        return s * (1 if times is None else times)

    @function(params=[Param("n", Integer)], variadic=Param("more", Integer), returns=Integer)
    def total(self, ctx, n, *more):
        return n + sum(more)

    @function(params=[Param("name", String)], returns=Any)
    def via_host(self, ctx, name):
        """What the engine's Host service says: a function's result, a lookup, a lock."""
        with ctx.host.lock(name) as lock_id:
            found = ctx.host.lookup_resource(name)
            return {"upper": ctx.host.call_function("to_upper", name), "lock": lock_id,
                    "found": found and [found.external_id, found.spec]}


def spec_of(**kw):
    return {"name": "a", "nested": {}, **kw}


# ---------------------------------------------------------------- SDK units


def test_value_round_trips():
    cases = [
        None, True, False, 0, -(2**63), 2**63 - 1, 1.5, "", "ü", [], {}, [1, "a", None],
        {"b": 1, "a": [True, {"z": 2.0}]},  # map order kept
        UNKNOWN, {"id": UNKNOWN},
    ]
    for c in cases:
        back = from_value(to_value(c))
        assert back == c and type(back) is type(c), (c, back)
    assert list(from_value(to_value({"b": 1, "a": 2}))) == ["b", "a"]
    assert to_value(1).WhichOneof("kind") == "int" and to_value(1.0).WhichOneof("kind") == "float"
    assert to_value(True).WhichOneof("kind") == "bool"
    assert to_value([]).WhichOneof("kind") == "list" and to_value({}).WhichOneof("kind") == "map"
    assert from_value(types_pb2.Value()) is None, "a Value without a kind is null"
    # Sensitive marks: kept with keep_sensitive, dropped otherwise, at any depth.
    secret = {"user": "ada", "password": Sensitive("s3cret"), "keys": [Sensitive(1)]}
    v = to_value(secret)
    assert v.map.entries[1].value.sensitive and v.map.entries[1].value.string == "s3cret"
    assert not v.map.entries[0].value.sensitive
    assert from_value(v, keep_sensitive=True) == secret
    assert to_value(from_value(v, keep_sensitive=True)) == v
    assert from_value(v) == {"user": "ada", "password": "s3cret", "keys": [1]} == reveal(secret)
    assert to_value(Sensitive(UNKNOWN)).sensitive and to_value(Sensitive(UNKNOWN)).HasField("unknown")
    assert "s3cret" not in repr(secret) and "s3cret" not in f"{secret['password']}"
    assert not UNKNOWN, "UNKNOWN is falsy, so `if spec.get(x):` skips it"
    for bad in (2**63, {1: "a"}, object()):
        try:
            to_value(bad)
            raise AssertionError(f"{bad!r} converted")
        except (TypeError, ValueError):
            pass
    assert from_path(to_path(["a", 0, "b.c"])) == ["a", 0, "b.c"]
    assert from_path(to_path("a")) == ["a"] and from_path(to_path(3)) == [3]


def test_manifest_and_capabilities():
    with Harness(T()) as h:
        hs = h.handshake()
        assert hs.protocol_version == 1 and hs.plugin.name == "t" and hs.plugin.version == "1.2.3"
        caps = hs.capabilities
        assert caps.functions and caps.cancel and not caps.read_resource, caps  # Probe has no read
        assert caps.destroy_resources, caps
        assert not caps.import_resource and not any(t.importable for t in h.manifest().resource_types)
        m = h.manifest()
        assert m.SerializeToString(deterministic=True) == h.manifest().SerializeToString(deterministic=True)
        (rt,) = m.resource_types
        fields = {f.name: f for f in rt.spec_schema.fields}
        assert list(fields) == ["name", "mode", "count", "nested", "token", "seen"]
        assert fields["name"].required and fields["token"].computed and fields["token"].sensitive
        assert from_value(fields["count"].schema.default) == 2
        assert fields["nested"].schema.fields[0].name == "depth"
        assert [f.name for f in m.functions] == ["rep", "total", "via_host"]
        assert m.functions[0].description == "s repeated."
        assert [(p.name, p.optional) for p in m.functions[0].params] == [("s", False), ("times", True)]
        assert m.functions[1].variadic.name == "more"
        assert [f.name for f in m.config_schema.fields] == ["region"]
        # A wrong nonce or no common version: FAILED_PRECONDITION.
        for kw in ({"nonce": "nope"}, {"versions": [2]}):
            try:
                h.handshake(**kw)
                raise AssertionError(f"handshake accepted {kw}")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
    with Harness(KV()) as h:
        caps = h.handshake().capabilities
        assert caps.read_resource and caps.import_resource and not caps.functions
        (rt,) = h.manifest().resource_types
        assert rt.importable
        flags = {f.name: (f.required, f.computed, f.must_recreate) for f in rt.spec_schema.fields}
        assert flags == {"key": (True, False, True), "value": (True, False, False),
                         "path": (False, True, False)}, flags


def test_apply_stream_context_and_defaults():
    with Harness(T()) as h:
        progress, result = h.apply("t/probe", "r", spec_of(name=Sensitive("a")), key="idem-1",
                                   deadline_s=120, call_id="call-7")
        assert [(p.message, p.fraction) for p in progress] == [("one", 0.25), ("two", -1.0)]
        assert not result.HasField("error"), result.error
        assert result.external_id == "id-a"
        state = from_value(result.state, keep_sensitive=True)
        assert state["token"] == Sensitive("tok"), "a field declared sensitive is marked"
        seen = state["seen"]
        assert seen["call_id"] == "call-7" and seen["key"] == "idem-1"
        assert seen["instance_id"] == "inst-1" and seen["request_id"] == "req-1"
        assert 100 < seen["deadline_left"] <= 120, seen
        assert seen["config"] == {"region": "eu"}, "config defaults filled in"
        assert seen["count"] == 2 and seen["depth"] == 1, "spec defaults filled in, nested too"
        assert seen["name_sensitive"] is True and seen["created"] is True
        # An update: current is given; an empty external id keeps the current one.
        current = h.state("t/probe", "r", spec_of(), result)
        _, again = h.apply("t/probe", "r", spec_of(), current=current)
        assert from_value(again.state)["seen"]["created"] is False


def test_errors_become_responses():
    with Harness(T()) as h:
        cases = {
            "bad": (types_pb2.ERROR_CLASS_BAD_INPUT, ["nested", "depth"]),
            "partial": (types_pb2.ERROR_CLASS_TRANSIENT, []),
            "crash": (types_pb2.ERROR_CLASS_INTERNAL, []),
            "oserror": (types_pb2.ERROR_CLASS_NOT_FOUND, []),
        }
        for mode, (cls, path) in cases.items():
            _, r = h.apply("t/probe", "r", spec_of(mode=mode))
            assert r.HasField("error"), mode
            assert error_class(r.error) == cls, (mode, r.error)
            assert from_path(r.error.path) == path, (mode, r.error)
            assert "s3cret" not in r.error.message, "an exception's text is not sent"
        _, r = h.apply("t/probe", "r", spec_of(mode="partial"))
        assert r.external_id == "p-1"
        assert from_value(r.error.partial_state, keep_sensitive=True) == {"token": Sensitive("t0")}
        # The SDK's own checks: a required field, an unknown type.
        _, r = h.apply("t/probe", "r", {"nested": {}})
        assert error_class(r.error) == types_pb2.ERROR_CLASS_BAD_INPUT and from_path(r.error.path) == ["name"]
        _, r = h.apply("t/nope", "r", spec_of())
        assert error_class(r.error) == types_pb2.ERROR_CLASS_BAD_INPUT
        # Destroy: an error class; validate: a diagnostic, not a failed call.
        current = h.state("t/probe", "r", spec_of(mode="deny"), r)
        assert error_class(h.destroy(current).error) == types_pb2.ERROR_CLASS_PERMISSION
        (d,) = h.validate("t/probe", spec_of(mode="raise"))
        assert (d.severity, d.code, from_path(d.path)) == (types_pb2.SEVERITY_ERROR, "plugin.conflict", ["mode"])
        (d,) = h.validate("t/probe", spec_of(mode="crash"))
        assert d.code == "plugin.internal" and "s3cret" not in d.message
        (d,) = h.validate("t/probe", spec_of(name=UNKNOWN))
        assert d.severity == types_pb2.SEVERITY_INFO and d.code == "t.later"
        # Still serving after all that.
        _, r = h.apply("t/probe", "r", spec_of())
        assert not r.HasField("error")


def test_cancel_reaches_the_context():
    with Harness(T()) as h:
        out = queue.Queue()
        threading.Thread(
            target=lambda: out.put(h.apply("t/probe", "r", spec_of(mode="wait"), call_id="c-9")),
            daemon=True,
        ).start()
        deadline = time.monotonic() + RPC_TIMEOUT
        while not h.cancel("c-9"):  # not in flight yet
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.05)
        _, r = out.get(timeout=RPC_TIMEOUT)
        assert error_class(r.error) == types_pb2.ERROR_CLASS_TRANSIENT and "cancelled" in r.error.message
        assert not h.cancel("c-9"), "no longer in flight"


def test_destroy_resources_answers_each_item_as_it_finishes():
    """DestroyResources: every item through the resource's destroy with its own key; the quick
    answers are not held behind a slow one; Cancel of the call's id reaches the slow one."""
    Probe.destroyed_keys.clear()
    with Harness(T()) as h:
        def item(mode, key, type_name="t/probe"):
            return plugin_pb2.DestroyItem(idempotency_key=key, current=plugin_pb2.ResourceState(
                resource_type=type_name, resource_name=mode, external_id="id-" + mode,
                spec=to_value(spec_of(mode=mode))))
        req = plugin_pb2.DestroyResourcesRequest(
            context=h.call_context(call_id="batch-1", key=""),
            items=[item("wait", "k0"), item("ok", "k1"), item("deny", "k2"),
                   item("ok", "k3", "t/nope")])
        stream = h.provider.DestroyResources(req, timeout=RPC_TIMEOUT)
        quick = sorted((next(stream) for _ in range(3)), key=lambda e: e.index)
        assert [(e.index, e.HasField("error") and error_class(e.error)) for e in quick] == [
            (1, False), (2, types_pb2.ERROR_CLASS_PERMISSION), (3, types_pb2.ERROR_CLASS_BAD_INPUT)]
        assert h.cancel("batch-1"), "the items share the call's id"
        last = next(stream)
        assert last.index == 0 and error_class(last.error) == types_pb2.ERROR_CLASS_TRANSIENT
        assert "cancelled" in last.error.message, last.error
        assert list(stream) == []
        assert sorted(Probe.destroyed_keys) == ["k0", "k1", "k2"]


def test_functions():
    with Harness(T()) as h:
        def call(name, *args):
            return h.call_function(name, *args)

        r = call("rep", "ab", 3)
        assert not r.HasField("error") and from_value(r.result) == "ababab"
        assert from_value(call("rep", "ab").result) == "ab", "an optional argument left out"
        assert from_value(call("rep", "ab", None).result) == "ab", "or null"
        assert from_value(call("total", 1, 2, 3).result) == 6, "variadic"
        r = call("rep", 5)
        assert error_class(r.error) == types_pb2.ERROR_CLASS_BAD_INPUT and from_path(r.error.path) == [0]
        r = call("rep", "a", "b")
        assert error_class(r.error) == types_pb2.ERROR_CLASS_BAD_INPUT and from_path(r.error.path) == [1]
        r = call("rep", "a", 1, 2)
        assert error_class(r.error) == types_pb2.ERROR_CLASS_BAD_INPUT and from_path(r.error.path) == [2]
        assert error_class(call("rep").error) == types_pb2.ERROR_CLASS_BAD_INPUT
        assert error_class(call("nope").error) == types_pb2.ERROR_CLASS_NOT_FOUND
        r = call("rep", UNKNOWN, 2)
        assert r.result.WhichOneof("kind") == "unknown", "unknown in, unknown out"
        r = call("rep", Sensitive("pw"), 2)
        assert r.result.string == "pwpw" and r.result.sensitive, "secret in, secret out"


class FakeHost(plugin_pb2_grpc.HostServicer):
    """The engine's Host service, as far as test_host_client needs it."""

    def __init__(self):
        self.seen = []

    def _check(self, context):
        if dict(context.invocation_metadata()).get("x-trellis-host-token") != "tok-1":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")

    def CallFunction(self, request, context):
        self._check(context)
        if request.name != "to_upper":
            return plugin_pb2.CallFunctionResponse(error=BadInput("no such", [0]).to_proto())
        return plugin_pb2.CallFunctionResponse(result=to_value(from_value(request.args[0]).upper()))

    def LookupResource(self, request, context):
        self._check(context)
        self.seen.append(("lookup", request.instance_id, request.resource_name))
        return plugin_pb2.LookupResourceResponse(found=True, resource=plugin_pb2.ResourceState(
            resource_name=request.resource_name, external_id="ext-1", spec=to_value({"a": 1})))

    def AcquireLock(self, request, context):
        self._check(context)
        self.seen.append(("lock", request.instance_id, request.resource_name))
        return plugin_pb2.AcquireLockResponse(acquired=True, lock_id="lock-1")

    def ReleaseLock(self, request, context):
        self._check(context)
        self.seen.append(("release", request.lock_id))
        return plugin_pb2.ReleaseLockResponse()


def test_host_client():
    from concurrent import futures

    fake = FakeHost()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    plugin_pb2_grpc.add_HostServicer_to_server(fake, server)
    d = tempfile.mkdtemp(prefix="trellis-host-")
    server.add_insecure_port("unix:" + os.path.join(d, "host.sock"))
    server.start()
    try:
        with Harness(T()) as h:
            h.handshake(host_address="unix:" + os.path.join(d, "host.sock"), host_token="tok-1")
            r = h.call_function("via_host", "web", instance_id="inst-9")
            assert not r.HasField("error"), r.error
            assert from_value(r.result) == {"upper": "WEB", "lock": "lock-1",
                                            "found": ["ext-1", {"a": 1}]}, r
            assert fake.seen == [("lock", "inst-9", "web"), ("lookup", "inst-9", "web"),
                                 ("release", "lock-1")], fake.seen
            # A wrong token: the Host's refusal is the function's error, not a crash.
            h.handshake(host_address="unix:" + os.path.join(d, "host.sock"), host_token="nope")
            r = h.call_function("via_host", "web")
            assert error_class(r.error) == types_pb2.ERROR_CLASS_INTERNAL and "UNAUTHENTICATED" in r.error.message
    finally:
        server.stop(0)
        shutil.rmtree(d, ignore_errors=True)


def test_kv_in_process():
    d = tempfile.mkdtemp(prefix="trellis-kvt-")
    try:
        with Harness(KV(), config={"dir": d}) as h:
            spec = {"key": "a.txt", "value": Sensitive("s3cret")}
            progress, r = h.apply("kv/entry", "a", spec)
            assert len(progress) == 1 and not r.HasField("error"), r
            path = os.path.join(d, "a.txt")
            assert r.external_id == "a.txt" and from_value(r.state) == {"path": path}
            with open(path) as f:
                assert f.read() == "s3cret"
            current = h.state("kv/entry", "a", spec, r)
            read = h.read(current)
            assert read.exists and from_value(read.spec, keep_sensitive=True) == spec, read
            with open(path, "w") as f:
                f.write("changed")
            read = h.read(current)
            value = read.spec.map.entries[1].value
            assert value.string == "changed" and value.sensitive, "drift, still secret"
            assert not h.destroy(current).HasField("error") and not os.path.exists(path)
            assert not h.destroy(current).HasField("error"), "destroying twice is fine"
            assert not h.read(current).exists
            with open(os.path.join(d, "byhand"), "w") as f:
                f.write("v")
            imp = h.import_resource("kv/entry", "h", "byhand")
            assert imp.exists and imp.external_id == "byhand", imp
            assert from_value(imp.spec) == {"key": "byhand", "value": "v"}, imp
            assert not h.import_resource("kv/entry", "h", "missing").exists
            _, r = h.apply("kv/entry", "b", {"key": "../x", "value": "v"})
            assert error_class(r.error) == types_pb2.ERROR_CLASS_BAD_INPUT and from_path(r.error.path) == ["key"]
            (diag,) = h.validate("kv/entry", {"key": "../x", "value": "v"})
            assert diag.code == "kv.bad-key" and from_path(diag.path) == ["key"]
            assert h.validate("kv/entry", {"key": UNKNOWN, "value": "v"}) == []
            _, r = h.apply("kv/entry", "c", {"key": "k", "value": "v"}, config={"dir": "rel"})
            assert error_class(r.error) == types_pb2.ERROR_CLASS_BAD_INPUT and "dir" in r.error.message
            (diag,) = list(h.provider.ValidateConfig(
                plugin_pb2.ValidateConfigRequest(context=h.call_context(config={"dir": "rel"})),
                timeout=RPC_TIMEOUT).diagnostics)
            assert diag.code == "kv.dir-relative" and from_path(diag.path) == ["dir"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- launch and lifetime


SLOW_PROVIDER = '''
from trellis_plugin import Applied, Field, Integer, Provider, Resource, serve

class Thing(Resource):
    type_name = "slow/thing"
    fields = [Field("ms", Integer, required=True)]

    def apply(self, ctx, spec, current):
        ctx.progress("started", 0.0)
        ctx.sleep(spec["ms"] / 1000)  # raises Cancelled once the call is cancelled
        return Applied("done")

    def destroy(self, ctx, current):
        pass

class Slow(Provider):
    name = "slow"
    resources = [Thing]

serve(Slow())
'''


class Plugin(PluginProcess):
    """A kv (or another SDK-built) plugin process, as the engine holds it."""

    def __init__(self, argv=None, versions="1", env=None):
        super().__init__(argv or [LAUNCHER], versions=versions, env=dict(env or {}, PYTHONPATH=SDK))

    def handshake(self, nonce=None):
        return plugin_pb2_grpc.PluginStub(self.channel).Handshake(
            plugin_pb2.HandshakeRequest(nonce=self.nonce if nonce is None else nonce,
                                        protocol_versions=[1]),
            timeout=RPC_TIMEOUT,
        )


def slow_plugin():
    script_dir = tempfile.mkdtemp(prefix="trellis-slow-")
    script = os.path.join(script_dir, "slow.py")
    with open(script, "w") as f:
        f.write(SLOW_PROVIDER)
    p = Plugin([sys.executable, "-u", script])
    p.cleanup.append(script_dir)
    return p


def start_slow_apply(p, ms):
    """An ApplyResource stream of the slow provider, after its first (progress) event."""
    stream = plugin_pb2_grpc.ProviderStub(p.channel).ApplyResource(
        plugin_pb2.ApplyResourceRequest(
            context=types_pb2.CallContext(call_id="slow-1", idempotency_key="k",
                                          deadline_unix_ms=int((time.time() + 60) * 1000)),
            resource_type="slow/thing", resource_name="x", desired_spec=to_value({"ms": ms}),
        ),
        timeout=RPC_TIMEOUT * 3,
    )
    assert next(stream).WhichOneof("event") == "progress"
    return stream


def test_launch_handshake_health_logs_and_stdin_eof():
    with Plugin() as p:
        p.connect()
        assert stat.S_IMODE(os.stat(p.socket_path).st_mode) == 0o600, "socket is not 0600"
        try:
            p.handshake(nonce="not-the-nonce")
            raise AssertionError("a wrong nonce was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
        hs = p.handshake()
        assert hs.plugin.kind == plugin_pb2.PLUGIN_KIND_PROVIDER and hs.plugin.name == "kv"
        health = health_pb2_grpc.HealthStub(p.channel)
        for service in ("", "trellis.plugin.v1.Provider"):
            r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
            assert r.status == health_pb2.HealthCheckResponse.SERVING, service
        p.channel.close()
        p.channel = None
        p.proc.stdin.close()  # the engine went away
        assert p.wait_exit() == 0
        assert not os.path.exists(p.socket_path), "socket left behind"
        # The stderr pump may still be reading: wait for the line this test expects.
        deadline = time.monotonic() + EXIT_TIMEOUT
        while time.monotonic() < deadline and not any(
            line and "wrong nonce" in line for line in list(p.logs)
        ):
            time.sleep(0.05)
        lines = [line for line in p.logs if line is not None]
        assert lines, "no log lines"
        for line in lines:  # stderr is a pipe: one JSON object a line, as the engine reads them
            obj = json.loads(line)
            assert obj["level"] in ("ERROR", "WARN", "INFO", "DEBUG", "TRACE") and obj["message"], obj
        assert any("wrong nonce" in json.loads(line)["message"] for line in lines)


def test_sigterm_exits_0_and_removes_socket():
    with Plugin() as p:
        p.connect()
        p.handshake()
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait_exit() == 0
        assert not os.path.exists(p.socket_path), "socket left behind"


def test_sigterm_lets_an_in_flight_call_finish():
    with slow_plugin() as p:
        p.connect()
        stream = start_slow_apply(p, 800)
        p.proc.send_signal(signal.SIGTERM)
        (last,) = list(stream)
        assert last.result.external_id == "done" and not last.result.HasField("error"), last
        assert p.wait_exit() == 0
        assert not os.path.exists(p.socket_path)


def test_sigterm_refuses_new_calls_while_in_flight_ones_finish():
    with slow_plugin() as p:
        p.connect()
        stream = start_slow_apply(p, 1500)
        p.proc.send_signal(signal.SIGTERM)
        # Logged once calls are refused.
        deadline = time.monotonic() + EXIT_TIMEOUT
        while not any("shutting down" in (line or "") for line in list(p.logs)):
            assert time.monotonic() < deadline, "no shutdown line"
            time.sleep(0.02)
        (refused,) = list(plugin_pb2_grpc.ProviderStub(p.channel).ApplyResource(
            plugin_pb2.ApplyResourceRequest(
                context=types_pb2.CallContext(call_id="late-1", idempotency_key="k2"),
                resource_type="slow/thing", resource_name="y", desired_spec=to_value({"ms": 0}),
            ),
            timeout=RPC_TIMEOUT,
        ))
        assert error_class(refused.result.error) == types_pb2.ERROR_CLASS_TRANSIENT, refused
        assert "shutting down" in refused.result.error.message, refused
        (last,) = list(stream)
        assert last.result.external_id == "done" and not last.result.HasField("error"), last
        assert p.wait_exit() == 0


def test_sigterm_cancels_a_call_that_outlasts_the_grace():
    with slow_plugin() as p:
        p.connect()
        stream = start_slow_apply(p, 60_000)
        started = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        (last,) = list(stream)  # answered: cancelled before the grace ran out
        assert error_class(last.result.error) == types_pb2.ERROR_CLASS_TRANSIENT, last
        assert p.wait_exit() == 0
        assert time.monotonic() - started < 30, "the grace is 4 s"


def test_stdin_eof_with_a_call_in_flight_stops_at_once():
    with slow_plugin() as p:
        p.connect()
        start_slow_apply(p, 60_000)
        started = time.monotonic()
        p.proc.stdin.close()
        assert p.wait_exit() == 0
        # Not waiting out the call (60 s): a bound on a hang, not a speed check.
        assert time.monotonic() - started < 30, "stdin EOF waited for the call"
        assert not os.path.exists(p.socket_path)


def test_run_by_hand_explains_and_exits_2():
    with Plugin(versions=None) as p:
        assert p.wait_exit() == 2
        time.sleep(0.2)
        assert any("started by the Trellis engine" in (line or "") for line in p.logs), p.logs
        assert p.handshake_line() is None


def test_refuses_an_unsupported_protocol_version():
    with Plugin(versions="2") as p:
        assert p.handshake_line() is None
        assert p.wait_exit() == 1


# ---------------------------------------------------------------- through the engine


# Two entries, so that the destroy sends them in one DestroyResources call.
BLUEPRINT = """version: 2023-04-20
resources:
  greeting:
    type: kv/entry
    spec:
      key: greeting
      value: hello
  farewell:
    type: kv/entry
    spec:
      key: farewell
      value: bye
"""


def test_engine_deploy_drift_destroy():
    trellis = os.path.join(rust_binaries(), "trellis")
    tmp = tempfile.mkdtemp(prefix="trellis-kv-")
    entries = os.path.join(tmp, "entries")
    sock = os.path.join(tmp, "engine.sock")
    with open(os.path.join(tmp, "trellis.toml"), "w") as f:
        f.write(f'[providers.kv]\ndir = "{entries}"\n')  # sent to kv as its provider config
    with open(os.path.join(tmp, "kv.yaml"), "w") as f:
        f.write(BLUEPRINT)
    engine_log = open(os.path.join(tmp, "engine.log"), "w")
    proc = subprocess.Popen(
        [trellis, "serve", "--listen", "unix:" + sock, "--data-dir", os.path.join(tmp, "data"),
         "--plugin-dir", os.path.join(HERE, "bin"), "--no-bundled-plugins",
         "--config", os.path.join(tmp, "trellis.toml")],
        stdout=subprocess.PIPE, stderr=engine_log, text=True,
    )

    def cli(*args):
        out = subprocess.run([trellis, *args, "--engine", "unix:" + sock, "--format", "json"],
                             capture_output=True, text=True, timeout=EXIT_TIMEOUT)
        return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else None), out.stderr

    try:
        line = proc.stdout.readline()
        assert line.strip() == "trellis engine listening on unix:" + sock, line
        code, doc, err = cli("deploy", os.path.join(tmp, "kv.yaml"), "--instance", "kv-e2e")
        assert code == 0, f"deploy exit {code}: {doc} {err}"
        assert doc["operation"]["status"] == "SUCCEEDED", doc
        path = os.path.join(entries, "greeting")
        with open(path) as f:
            assert f.read() == "hello"

        code, doc, err = cli("drift", "--instance", "kv-e2e")
        assert code == 0 and doc["drifted"] is False, f"{code} {doc} {err}"

        with open(path, "w") as f:  # behind the engine's back
            f.write("tampered")
        code, doc, err = cli("drift", "--instance", "kv-e2e")
        assert code == 3 and doc["drifted"] is True, f"{code} {doc} {err}"
        (res,) = doc["resources"]
        assert (res["name"], res["type"], res["kind"]) == ("greeting", "kv/entry", "CHANGED"), res
        assert [(f["path"], f["previous"], f["new"]) for f in res["fields"]] == [
            ("spec.value", "hello", "tampered")], res

        code, doc, err = cli("destroy", "--instance", "kv-e2e")
        assert code == 0 and doc["operation"]["status"] == "SUCCEEDED", f"{code} {doc} {err}"
        assert not os.path.exists(path), "destroy left the file"
        assert not os.path.exists(os.path.join(entries, "farewell")), "destroy left the file"
        engine_log.flush()
        with open(engine_log.name) as f:
            assert "DestroyResources: 2 items" in f.read(), "the destroys were not sent together"

        # An entry made by hand is imported by its key; the spec printed plans no change.
        with open(os.path.join(entries, "byhand"), "w") as f:
            f.write("kept")
        code, doc, err = cli("import", "byhand", "--instance", "kv-import", "--type", "kv/entry",
                             "--id", "byhand")
        assert code == 0 and doc["operation"]["status"] == "SUCCEEDED", f"{code} {doc} {err}"
        assert doc["resource"]["spec"] == {"key": "byhand", "value": "kept"}, doc
        imported = os.path.join(tmp, "imported.yaml")
        with open(imported, "w") as f:
            f.write("version: 2023-04-20\nresources:\n  byhand:\n    type: kv/entry\n"
                    "    spec:\n      key: byhand\n      value: kept\n")
        code, doc, err = cli("plan", imported, "--instance", "kv-import")
        assert code == 0, f"{code} {doc} {err}"
        assert [r["action"] for r in doc["changeSet"]["resources"]] == ["NO_CHANGE"], doc

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EXIT_TIMEOUT) == 0
    except BaseException:
        engine_log.flush()
        with open(os.path.join(tmp, "engine.log")) as f:
            print("--- engine log\n" + f.read()[-4000:], file=sys.stderr)
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        engine_log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    return run_tests("kv", globals())


if __name__ == "__main__":
    sys.exit(main())

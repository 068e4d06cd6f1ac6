#!/usr/bin/env python3
"""Self-test of the pyecho provider, acting as the engine would.

It launches bin/trellis-provider-pyecho with the documented environment and a
fresh 0700 socket directory, reads stdout up to the handshake line, talks to
the plugin with a grpcio client generated from proto/ and checks the lifetime
rules. Everything it relies on is in docs/plugin-protocol.md and the .proto
files; nothing comes from the Rust code.

The last tests turn it around: the Rust servers (an SDK-built plugin, the
engine's Host service, the engine API on a Unix socket) must answer a stock
grpcio channel, which sends the socket path as `:authority`. They build the
Rust binaries first (`cargo build`, a no-op when they are fresh).

Run: python3 -m pytest tests/interop/python  or  python3 tests/interop/python/test_pyecho.py
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trellis_interop import (  # noqa: E402
    HERE,
    UNKNOWN,
    ensure_stubs,
    error_class,
    from_value,
    map_get,
    path_to_list,
    plugin_pb2,
    plugin_pb2_grpc,
    to_value,
    types_pb2,
)

ensure_stubs()

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from plugin_process import (  # noqa: E402
    EXIT_TIMEOUT,
    RPC_TIMEOUT,
    PluginProcess,
    run_tests,
    rust_binaries,
)

LAUNCHER = os.path.join(HERE, "bin", "trellis-provider-pyecho")


class Plugin(PluginProcess):
    """The pyecho launcher (or another plugin binary), as the engine holds it."""

    def __init__(self, versions="1", launcher=LAUNCHER):
        super().__init__([launcher], versions=versions)

    def plugin(self):
        return plugin_pb2_grpc.PluginStub(self.channel)

    def provider(self):
        return plugin_pb2_grpc.ProviderStub(self.channel)

    def handshake(self, nonce=None):
        return self.plugin().Handshake(
            plugin_pb2.HandshakeRequest(
                nonce=self.nonce if nonce is None else nonce,
                protocol_versions=[1],
                host_address="unix:" + os.path.join(self.sock_dir, "host.sock"),
                host_token="test-host-token",
            ),
            timeout=RPC_TIMEOUT,
        )


def ctx(config=None, key=""):
    return types_pb2.CallContext(
        call_id=uuid.uuid4().hex,
        provider_config=to_value(config or {}),
        instance_id="inst-1",
        idempotency_key=key,
        deadline_unix_ms=int(time.time() * 1000) + 60_000,
    )


def apply(provider, spec, config=None, current=None, name="greeting"):
    req = plugin_pb2.ApplyResourceRequest(
        context=ctx(config, key=uuid.uuid4().hex),
        resource_type="pyecho/message",
        resource_name=name,
        desired_spec=spec,
    )
    if current is not None:
        req.current.CopyFrom(current)
    return list(provider.ApplyResource(req, timeout=RPC_TIMEOUT))


def resource_state(name, result, spec):
    return plugin_pb2.ResourceState(
        resource_type="pyecho/message",
        resource_name=name,
        external_id=result.external_id,
        spec=spec,
        state=result.state,
    )


# ---------------------------------------------------------------- tests


def test_engine_flow_then_stdin_eof():
    with Plugin() as p:
        p.connect()

        # Handshake: a wrong nonce is refused, the right one accepted.
        try:
            p.handshake(nonce="not-the-nonce")
            raise AssertionError("a wrong nonce was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
        hs = p.handshake()
        assert hs.protocol_version == 1
        assert hs.plugin.kind == plugin_pb2.PLUGIN_KIND_PROVIDER
        assert hs.plugin.name == "pyecho"
        assert hs.capabilities.read_resource and hs.capabilities.functions
        assert not hs.capabilities.links and not hs.capabilities.plan_resource

        # Health.
        health = health_pb2_grpc.HealthStub(p.channel)
        for service in ("", "trellis.plugin.v1.Provider"):
            resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, service

        # Manifest: complete, and the same bytes every time (it is cached).
        m = p.plugin().GetManifest(plugin_pb2.GetManifestRequest(), timeout=RPC_TIMEOUT)
        m2 = p.plugin().GetManifest(plugin_pb2.GetManifestRequest(), timeout=RPC_TIMEOUT)
        assert m.SerializeToString(deterministic=True) == m2.SerializeToString(deterministic=True)
        assert m.plugin == hs.plugin
        (rt,) = m.resource_types
        assert rt.type == "pyecho/message"
        assert rt.spec_schema.type == plugin_pb2.SCHEMA_TYPE_OBJECT
        fields = {f.name: f for f in rt.spec_schema.fields}
        assert list(fields) == [
            "text", "repeat", "rendered", "id", "lookup", "lookupInstance", "lookedUp"
        ]
        assert fields["text"].required and fields["text"].schema.type == plugin_pb2.SCHEMA_TYPE_STRING
        assert fields["repeat"].schema.type == plugin_pb2.SCHEMA_TYPE_INTEGER
        assert from_value(fields["repeat"].schema.default) == 1
        assert fields["rendered"].computed and fields["id"].computed
        assert [f.name for f in m.functions] == ["upper", "host_upper", "engine_capabilities"]
        for fn in m.functions:
            assert fn.returns == plugin_pb2.SCHEMA_TYPE_STRING
            assert [(a.name, a.type) for a in fn.params] == [("s", plugin_pb2.SCHEMA_TYPE_STRING)]
        assert m.retry_policy.max_attempts >= 1
        assert [f.name for f in m.config_schema.fields] == ["stateDir", "applyDelayMs", "driftOnRead"]

        prov = p.provider()

        # ValidateConfig and ValidateResource: diagnostics with attribute paths.
        v = prov.ValidateConfig(
            plugin_pb2.ValidateConfigRequest(context=ctx({"stateDir": "relative"})),
            timeout=RPC_TIMEOUT,
        )
        assert [path_to_list(d.path) for d in v.diagnostics] == [["stateDir"]]
        v = prov.ValidateResource(
            plugin_pb2.ValidateResourceRequest(
                context=ctx(),
                resource_type="pyecho/message",
                resource_name="greeting",
                spec=to_value({"text": "hi", "repeat": -1}),
            ),
            timeout=RPC_TIMEOUT,
        )
        (d,) = v.diagnostics
        assert d.severity == types_pb2.SEVERITY_ERROR and d.code == "pyecho.repeat-range"
        assert path_to_list(d.path) == ["repeat"]
        v = prov.ValidateResource(
            plugin_pb2.ValidateResourceRequest(
                context=ctx(),
                resource_type="pyecho/message",
                resource_name="greeting",
                spec=to_value({"text": UNKNOWN, "repeat": UNKNOWN}),
            ),
            timeout=RPC_TIMEOUT,
        )
        assert list(v.diagnostics) == [], "unknown values are not errors"

        # ApplyResource: one progress event, then the result, last.
        state_dir = os.path.join(p.sock_dir, "state")
        config = {"stateDir": state_dir}
        spec = to_value({"text": "ab", "repeat": 3})
        events = apply(prov, spec, config)
        assert [e.WhichOneof("event") for e in events] == ["progress", "result"]
        assert 0 <= events[0].progress.fraction <= 1
        result = events[-1].result
        assert not result.HasField("error"), result.error
        assert result.external_id.startswith("msg-")
        assert from_value(result.state) == {"id": result.external_id, "rendered": "ababab"}
        assert os.path.exists(os.path.join(state_dir, result.external_id + ".json"))

        # A retried create (same instance and name) gets the same id: no second resource.
        again = apply(prov, spec, config)[-1].result
        assert again.external_id == result.external_id

        # repeat left out: the schema default (1). A sensitive text stays sensitive.
        secret = to_value({"text": to_value("s3cret", sensitive=True)})
        res = apply(prov, secret, config, name="secret")[-1].result
        rendered = map_get(res.state, "rendered")
        assert rendered.string == "s3cret" and rendered.sensitive
        assert all("s3cret" not in line for line in p.log_lines()), "a sensitive value was logged"

        # Application errors travel in the response, with a class and a path.
        bad = apply(prov, to_value({"repeat": 2}), config, name="bad")[-1].result
        assert error_class(bad.error) == types_pb2.ERROR_CLASS_BAD_INPUT
        assert path_to_list(bad.error.path) == ["text"]

        # ReadResource: exists, then drift, then gone.
        current = resource_state("greeting", result, spec)
        read = prov.ReadResource(
            plugin_pb2.ReadResourceRequest(context=ctx(config), current=current),
            timeout=RPC_TIMEOUT,
        )
        assert read.exists and from_value(read.spec) == {"text": "ab", "repeat": 3}
        assert from_value(map_get(read.state, "rendered")) == "ababab"

        # Update keeps the external id.
        spec2 = to_value({"text": "ab", "repeat": 1})
        upd = apply(prov, spec2, config, current=current)[-1].result
        assert upd.external_id == result.external_id
        assert from_value(map_get(upd.state, "rendered")) == "ab"

        resp = prov.DestroyResource(
            plugin_pb2.DestroyResourceRequest(context=ctx(config, key="d1"), current=current),
            timeout=RPC_TIMEOUT,
        )
        assert not resp.HasField("error")
        read = prov.ReadResource(
            plugin_pb2.ReadResourceRequest(context=ctx(config), current=current),
            timeout=RPC_TIMEOUT,
        )
        assert not read.exists
        # Destroying what is gone is not an error.
        resp = prov.DestroyResource(
            plugin_pb2.DestroyResourceRequest(context=ctx(config, key="d1"), current=current),
            timeout=RPC_TIMEOUT,
        )
        assert not resp.HasField("error")

        # CallFunction: upper(string); a bad argument is BAD_INPUT at [index 0].
        fr = prov.CallFunction(
            plugin_pb2.CallFunctionRequest(context=ctx(), name="upper", args=[to_value("hello")]),
            timeout=RPC_TIMEOUT,
        )
        assert not fr.HasField("error") and from_value(fr.result) == "HELLO"
        fr = prov.CallFunction(
            plugin_pb2.CallFunctionRequest(context=ctx(), name="upper", args=[to_value(5)]),
            timeout=RPC_TIMEOUT,
        )
        assert error_class(fr.error) == types_pb2.ERROR_CLASS_BAD_INPUT
        assert path_to_list(fr.error.path) == [0]
        fr = prov.CallFunction(
            plugin_pb2.CallFunctionRequest(context=ctx(), name="upper", args=[to_value(UNKNOWN)]),
            timeout=RPC_TIMEOUT,
        )
        assert fr.result.WhichOneof("kind") == "unknown"

        # Not declared in Capabilities: a transport-level UNIMPLEMENTED.
        try:
            prov.FetchDataSource(plugin_pb2.FetchDataSourceRequest(context=ctx()), timeout=RPC_TIMEOUT)
            raise AssertionError("FetchDataSource answered")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNIMPLEMENTED

        # Lifetime: closing stdin (the engine went away) ends the plugin.
        p.channel.close()
        p.channel = None
        p.proc.stdin.close()
        assert p.wait_exit() == 0
        assert not os.path.exists(p.socket_path), "socket left behind"


def test_sigterm_exits_and_removes_socket():
    with Plugin() as p:
        p.connect()
        p.handshake()
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait_exit() == 0
        assert not os.path.exists(p.socket_path), "socket left behind"


def test_sigterm_lets_an_in_flight_call_finish():
    with Plugin() as p:
        p.connect()
        p.handshake()
        stream = p.provider().ApplyResource(
            plugin_pb2.ApplyResourceRequest(
                context=ctx({"applyDelayMs": 1000}, key="k"),
                resource_type="pyecho/message",
                resource_name="r",
                desired_spec=to_value({"text": "x"}),
            ),
            timeout=RPC_TIMEOUT,
        )
        first = next(stream)
        assert first.WhichOneof("event") == "progress"
        p.proc.send_signal(signal.SIGTERM)
        rest = list(stream)
        assert [e.WhichOneof("event") for e in rest] == ["result"], (rest, p.log_lines())
        assert p.wait_exit() == 0, p.log_lines()


def test_refuses_an_unsupported_protocol_version():
    with Plugin(versions="2") as p:
        assert p.handshake_line() is None
        assert p.wait_exit() != 0


def test_sdk_plugin_answers_a_stock_channel():
    # Plugin.connect opens grpc.insecure_channel("unix:...") without options: the
    # plugin sees the socket path as :authority.
    sim = os.path.join(rust_binaries(), "trellis-provider-sim")
    with Plugin(launcher=sim) as p:
        p.connect()
        hs = p.handshake()
        assert hs.plugin.kind == plugin_pb2.PLUGIN_KIND_PROVIDER and hs.plugin.name == "sim"
        health = health_pb2_grpc.HealthStub(p.channel)
        resp = health.Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_engine_host_service_answers_a_stock_channel():
    # pyecho's host_upper calls Host.CallFunction over a stock channel to the
    # engine's Host service, which `trellis plugins call` runs.
    trellis = os.path.join(rust_binaries(), "trellis")
    data = tempfile.mkdtemp(prefix="trellis-")
    try:
        out = subprocess.run(
            [trellis, "plugins", "call", "--no-bundled-plugins", "--data-dir", data,
             "--plugin-dir", os.path.join(HERE, "bin"), "pyecho", "host_upper", '["abc"]'],
            capture_output=True,
            text=True,
            timeout=EXIT_TIMEOUT,
        )
    finally:
        shutil.rmtree(data, ignore_errors=True)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stdout}{out.stderr}"
    assert out.stdout.strip() == '"ABC"', out.stdout


def test_engine_api_on_a_unix_socket_answers_a_stock_channel():
    from trellis.engine.v1 import engine_pb2, engine_pb2_grpc

    trellis = os.path.join(rust_binaries(), "trellis")
    data = tempfile.mkdtemp(prefix="trellis-")
    sock = os.path.join(data, "engine.sock")
    proc = subprocess.Popen(
        [trellis, "serve", "--no-bundled-plugins", "--data-dir", data, "--listen", "unix:" + sock],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        # stdout's first line says where it listens, once it accepts connections.
        line = proc.stdout.readline()
        assert line.strip() == "trellis engine listening on unix:" + sock, line
        with grpc.insecure_channel("unix:" + sock) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            resp = health.Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
            engine = engine_pb2_grpc.EngineStub(channel)
            listed = engine.ListInstances(engine_pb2.ListInstancesRequest(), timeout=RPC_TIMEOUT)
            assert list(listed.instances) == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EXIT_TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        shutil.rmtree(data, ignore_errors=True)


def main():
    return run_tests("pyecho", globals())


if __name__ == "__main__":
    sys.exit(main())

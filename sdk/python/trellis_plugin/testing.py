"""Harness: a provider's real gRPC services on a temporary Unix socket in the test process,
called through a real gRPC client, so a test exercises the protocol without launching a
process (and without the launch and lifetime parts, which serve() does)."""

import os
import shutil
import tempfile
import time
import uuid
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ._stubs import plugin_pb2, plugin_pb2_grpc, types_pb2
from .service import Calls, Declaration, PluginService, ProviderService
from .values import to_value

TIMEOUT = 30


class Harness:
    """with Harness(MyProvider(), config={...}) as h: h.apply("my/thing", "name", {...})"""

    def __init__(self, provider, config=None):
        self.decl = Declaration(provider)
        self.nonce = uuid.uuid4().hex
        self.config = config or {}
        self._dir = tempfile.mkdtemp(prefix="trellis-h-")
        self.socket_path = os.path.join(self._dir, "plugin.sock")
        self.calls = Calls()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        shared = {}
        plugin_pb2_grpc.add_PluginServicer_to_server(
            PluginService(self.decl, self.nonce, shared), self._server)
        plugin_pb2_grpc.add_ProviderServicer_to_server(
            ProviderService(self.decl, self.calls, shared), self._server)
        h = health.HealthServicer()
        h.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(h, self._server)
        self._server.add_insecure_port("unix:" + self.socket_path)
        self._server.start()
        self.channel = grpc.insecure_channel("unix:" + self.socket_path)
        self.plugin = plugin_pb2_grpc.PluginStub(self.channel)
        self.provider = plugin_pb2_grpc.ProviderStub(self.channel)

    def close(self):
        self.channel.close()
        self._server.stop(0).wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ requests

    def call_context(self, *, config=None, key=None, deadline_s=60.0, call_id=None,
                     instance_id="inst-1", request_id="req-1"):
        return types_pb2.CallContext(
            call_id=call_id or uuid.uuid4().hex,
            provider_config=to_value(self.config if config is None else config),
            instance_id=instance_id,
            idempotency_key=key if key is not None else uuid.uuid4().hex,
            deadline_unix_ms=int((time.time() + deadline_s) * 1000) if deadline_s else 0,
            request_id=request_id,
        )

    def handshake(self, nonce=None, versions=(1,), host_address="", host_token=""):
        return self.plugin.Handshake(
            plugin_pb2.HandshakeRequest(nonce=self.nonce if nonce is None else nonce,
                                        protocol_versions=list(versions),
                                        host_address=host_address, host_token=host_token),
            timeout=TIMEOUT,
        )

    def manifest(self):
        return self.plugin.GetManifest(plugin_pb2.GetManifestRequest(), timeout=TIMEOUT)

    def validate(self, resource_type, spec, name="r", **ctx):
        return list(self.provider.ValidateResource(
            plugin_pb2.ValidateResourceRequest(
                context=self.call_context(**ctx), resource_type=resource_type,
                resource_name=name, spec=to_value(spec)),
            timeout=TIMEOUT,
        ).diagnostics)

    def apply(self, resource_type, name, spec, current=None, **ctx):
        """(progress events, ApplyResult): the stream, checked to end with one result."""
        req = plugin_pb2.ApplyResourceRequest(
            context=self.call_context(**ctx), resource_type=resource_type,
            resource_name=name, desired_spec=to_value(spec))
        if current is not None:
            req.current.CopyFrom(current)
        events = list(self.provider.ApplyResource(req, timeout=TIMEOUT))
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds and kinds[-1] == "result" and kinds.count("result") == 1, kinds
        return [e.progress for e in events[:-1]], events[-1].result

    @staticmethod
    def state(resource_type, name, spec, result):
        """The ResourceState the engine would record after an apply."""
        return plugin_pb2.ResourceState(
            resource_type=resource_type, resource_name=name, external_id=result.external_id,
            spec=to_value(spec), state=result.state)

    def read(self, current, **ctx):
        return self.provider.ReadResource(
            plugin_pb2.ReadResourceRequest(context=self.call_context(**ctx), current=current),
            timeout=TIMEOUT)

    def import_resource(self, resource_type, name, external_id, **ctx):
        return self.provider.ImportResource(
            plugin_pb2.ImportResourceRequest(context=self.call_context(**ctx),
                                             resource_type=resource_type, resource_name=name,
                                             external_id=external_id),
            timeout=TIMEOUT)

    def destroy(self, current, **ctx):
        return self.provider.DestroyResource(
            plugin_pb2.DestroyResourceRequest(context=self.call_context(**ctx), current=current),
            timeout=TIMEOUT)

    def call_function(self, name, *args, **ctx):
        return self.provider.CallFunction(
            plugin_pb2.CallFunctionRequest(context=self.call_context(**ctx), name=name,
                                           args=[to_value(a) for a in args]),
            timeout=TIMEOUT)

    def cancel(self, call_id):
        return self.provider.Cancel(plugin_pb2.CancelRequest(call_id=call_id),
                                    timeout=TIMEOUT).cancelled

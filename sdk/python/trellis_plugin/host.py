"""A client of the engine's Host service, from the handshake's host address and token."""

import contextlib
import threading

import grpc

from ._stubs import plugin_pb2, plugin_pb2_grpc
from .errors import Internal, Transient, from_proto
from .provider import ResourceState
from .values import from_value, to_value

TOKEN_HEADER = "x-trellis-host-token"


def _rpc_error(what, e):
    # The engine unreachable or slow is worth a retry; anything else is not.
    code = e.code()
    cls = Transient if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else Internal
    return cls(f"Host.{what}: {code.name}: {e.details()}")


class _Channel:
    """One lazily opened channel to the engine's Host service."""

    def __init__(self, address):
        self._address = address
        self._lock = threading.Lock()
        self._channel = None

    def stub(self):
        with self._lock:
            if self._channel is None:
                # No channel options on purpose: the engine accepts the `:authority` grpcio
                # sends on a Unix socket (docs/plugin-protocol.md, "The Host service").
                self._channel = grpc.insecure_channel(self._address)
            return plugin_pb2_grpc.HostStub(self._channel)

    def close(self):
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None


class HostClient:
    """Calls the engine's Host service over a stock grpc channel. Errors are raised as the
    SDK's exceptions, so a callback can let them propagate. The token is never logged."""

    def __init__(self, address, token, instance_id="", timeout=30.0, _channel=None):
        self.address = address
        self._token = token
        self.instance_id = instance_id
        self.timeout = timeout
        self._conn = _channel or _Channel(address)

    def _call(self, what, request):
        try:
            return getattr(self._conn.stub(), what)(
                request, metadata=[(TOKEN_HEADER, self._token)], timeout=self.timeout
            )
        except grpc.RpcError as e:
            raise _rpc_error(what, e) from None

    def bound(self, instance_id):
        """The same client (and channel), defaulting to another instance: the SDK gives each
        call one bound to the call's instance."""
        return HostClient(self.address, self._token, instance_id, self.timeout, self._conn)

    def call_function(self, name, *args, keep_sensitive=False):
        """Calls a function of another plugin, or a core function: its result as a Python
        value. An error in the answer is raised as the matching PluginError."""
        resp = self._call(
            "CallFunction",
            plugin_pb2.HostCallFunctionRequest(name=name, args=[to_value(a) for a in args]),
        )
        if resp.HasField("error"):
            raise from_proto(resp.error)
        return from_value(resp.result, keep_sensitive)

    def lookup_resource(self, resource_name, instance_id=None):
        """A resource of the call's instance from the engine's state, as a ResourceState,
        or None when the engine has no such resource."""
        resp = self._call(
            "LookupResource",
            plugin_pb2.LookupResourceRequest(
                instance_id=instance_id or self.instance_id, resource_name=resource_name
            ),
        )
        if not resp.found:
            return None
        r = resp.resource
        return ResourceState(r.resource_type, r.resource_name, r.external_id,
                             from_value(r.spec) or {}, from_value(r.state) or {})

    @contextlib.contextmanager
    def lock(self, resource_name, timeout=30.0, instance_id=None):
        """`with ctx.host.lock("name"):` serialises updates of one resource across links and
        plugins; always released, also on failure."""
        resp = self._call(
            "AcquireLock",
            plugin_pb2.AcquireLockRequest(
                instance_id=instance_id or self.instance_id,
                resource_name=resource_name,
                timeout_ms=int(timeout * 1000),
            ),
        )
        if not resp.acquired:
            raise Transient(f"could not lock {resource_name} within {timeout:g}s")
        try:
            yield resp.lock_id
        finally:
            self._call("ReleaseLock", plugin_pb2.ReleaseLockRequest(lock_id=resp.lock_id))

    def close(self):
        self._conn.close()

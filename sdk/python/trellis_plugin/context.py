"""Context: what every callback gets besides its input."""

import logging
import threading
import time

from .errors import Cancelled
from .schema import fill_defaults
from .values import from_value, sensitive_paths


class Context:
    """The call's context.

    call_id, instance_id, request_id:  for log lines (ctx.log adds them to each line)
    idempotency_key:  the same key means the same operation: a retried create must find
                      what the first attempt made instead of making another
    deadline:         when the engine gives up on the call, seconds since the epoch, or None
    config:           the provider configuration (a dict, defaults filled in); it may hold
                      secrets: never log it
    local_assets:     {asset uri: path of the engine's read-only copy}; see local_asset()
    host:             a HostClient for the engine's Host service (None before a handshake)
    log:              a logger whose lines carry call_id and request_id
    """

    def __init__(self, *, config=None, call_id="", instance_id="", request_id="",
                 idempotency_key="", deadline=None, local_assets=None, host=None,
                 logger=None, sensitive=()):
        self.config = config if config is not None else {}
        self.call_id = call_id
        self.instance_id = instance_id
        self.request_id = request_id
        self.idempotency_key = idempotency_key
        self.deadline = deadline
        self.local_assets = dict(local_assets or {})
        self.host = host
        self.log = logging.LoggerAdapter(
            logger or logging.getLogger("trellis_plugin"),
            {"call_id": call_id, "request_id": request_id},
        )
        # Paths (tuples) of the sensitive values of this call's input: the spec, or a
        # function's arguments ((0,) is the first).
        self._sensitive = [tuple(p) for p in sensitive]
        self._cancel = threading.Event()
        self._progress = None  # set by the SDK during ApplyResource

    @classmethod
    def from_call(cls, cc, *, config_fields=(), host=None, logger=None, input_value=None):
        """The SDK's constructor, from the request's CallContext."""
        config = from_value(cc.provider_config)
        return cls(
            config=fill_defaults(config_fields, config if isinstance(config, dict) else {}),
            call_id=cc.call_id,
            instance_id=cc.instance_id,
            request_id=cc.request_id,
            idempotency_key=cc.idempotency_key,
            # 0 means "no deadline of its own" (docs/plugin-protocol.md).
            deadline=cc.deadline_unix_ms / 1000 if cc.deadline_unix_ms else None,
            local_assets=cc.local_assets,
            host=host,
            logger=logger,
            sensitive=sensitive_paths(input_value) if input_value is not None else (),
        )

    # ------------------------------------------------------------ time and cancellation

    def time_left(self):
        """Seconds until the deadline (negative once it passed), or None without one."""
        return None if self.deadline is None else self.deadline - time.time()

    @property
    def cancelled(self):
        """True once the call is cancelled: a Cancel RPC with this call's id, the engine
        dropping the call, the deadline passing, or the plugin shutting down. Check it in
        long operations and stop (raise Cancelled, with what was created so far)."""
        left = self.time_left()
        return self._cancel.is_set() or (left is not None and left <= 0)

    def check_cancelled(self):
        """Raises Cancelled once the call is cancelled."""
        if self.cancelled:
            raise Cancelled()

    def sleep(self, seconds):
        """Sleeps, but raises Cancelled as soon as the call is cancelled."""
        end = time.monotonic() + seconds
        while True:
            self.check_cancelled()
            left = end - time.monotonic()
            if left <= 0:
                return
            # Wake at the deadline too, which no one signals.
            wait = left if self.deadline is None else min(left, max(0.0, self.time_left()))
            self._cancel.wait(min(wait, 1.0))

    def cancel(self):
        """Marks the call cancelled (the SDK does it; tests may too)."""
        self._cancel.set()

    # ------------------------------------------------------------ input and progress

    def progress(self, message, fraction=None):
        """ApplyResource: streams a progress event (fraction 0..1, None when unknown). The
        user reads it: no secrets. A no-op in other calls."""
        if self._progress is not None:
            self._progress(message, fraction)

    def is_sensitive(self, *path):
        """Whether the input value at path (a spec field, or a function argument's index) or
        anything above it is marked sensitive. Keep the mark on what you derive from it:
        return Sensitive(derived)."""
        path = tuple(path)
        return any(path[: len(p)] == p for p in self._sensitive)

    def local_asset(self, uri):
        """The path of the engine's read-only copy of a local_asset field's value
        (`asset:sha256:<hex>/<name>`)."""
        try:
            return self.local_assets[uri]
        except KeyError:
            from .errors import BadInput

            raise BadInput("the engine sent no copy of this asset") from None

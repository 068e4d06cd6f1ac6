"""Application errors as exceptions.

Raise one from any callback: the SDK answers with the protocol's `Error` (class, message,
path, partial state) inside the response, as the protocol wants: gRPC status codes are for
transport failures only. Any other exception becomes an INTERNAL error, so a bug in a
callback never crashes the plugin.
"""

import errno

from ._stubs import types_pb2
from .values import to_path, to_value


class PluginError(Exception):
    """An application error. Use a subclass: its class decides whether the engine retries.

    path:          the attribute the error is about: "field", 0, or ["a", 0, "b"]
                   (relative to the spec; for a function, [N] is its N-th argument)
    partial_state: ApplyResource: what was created before the failure (a dict), so the
                   engine records it and nothing is orphaned
    external_id:   ApplyResource: the id of what was created before the failure
    """

    error_class = types_pb2.ERROR_CLASS_INTERNAL

    def __init__(self, message, path=None, *, partial_state=None, external_id=""):
        super().__init__(message)
        self.message = message
        self.path = path
        self.partial_state = partial_state
        self.external_id = external_id

    def to_proto(self):
        # `class` is a Python keyword: it can only be set through ** unpacking.
        err = types_pb2.Error(error_class=self.error_class, message=self.message)
        if self.path is not None:
            err.path.CopyFrom(to_path(self.path))
        if self.partial_state is not None:
            try:
                err.partial_state.CopyFrom(to_value(self.partial_state))
            except (TypeError, ValueError):
                # Still an answer: the error itself matters more than what it carries.
                err.message += " (its partial state is not a value and was dropped)"
        return err

    @property
    def class_name(self):
        return types_pb2.ErrorClass.Name(self.error_class).removeprefix("ERROR_CLASS_")


class Transient(PluginError):
    """Worth retrying: throttling, timeouts, eventual consistency. The only class retried."""

    error_class = types_pb2.ERROR_CLASS_TRANSIENT


class BadInput(PluginError):
    """The input is wrong; retrying cannot help. Give the path of the attribute."""

    error_class = types_pb2.ERROR_CLASS_BAD_INPUT


class Conflict(PluginError):
    """The resource is in a state that conflicts with the request."""

    error_class = types_pb2.ERROR_CLASS_CONFLICT


class NotFound(PluginError):
    """The resource, or something it needs, does not exist."""

    error_class = types_pb2.ERROR_CLASS_NOT_FOUND


class Permission(PluginError):
    """The provider's credentials do not allow the operation."""

    error_class = types_pb2.ERROR_CLASS_PERMISSION


class Internal(PluginError):
    """A bug or an unexpected condition in the plugin."""

    error_class = types_pb2.ERROR_CLASS_INTERNAL


class Cancelled(Transient):
    """The call was cancelled (Cancel RPC, deadline, the engine went away, shutdown)."""

    def __init__(self, message="the call was cancelled", **kw):
        super().__init__(message, **kw)


# OSError -> class, as the Rust SDK maps std::io::Error.
_OS_ERRORS = [
    (FileNotFoundError, NotFound),
    (PermissionError, Permission),
    ((FileExistsError, IsADirectoryError, NotADirectoryError), Conflict),
    ((TimeoutError, InterruptedError, ConnectionError), Transient),
]


def from_exception(exc, where):
    """Any exception -> a PluginError. Only OSError's strerror is quoted, never str(exc):
    an arbitrary exception's text may hold a value, and values may be secret."""
    if isinstance(exc, PluginError):
        return exc
    if isinstance(exc, OSError):
        what = exc.strerror or type(exc).__name__
        for types, cls in _OS_ERRORS:
            if isinstance(exc, types):
                return cls(f"{where}: {what}")
        if exc.errno == errno.EROFS:
            return Permission(f"{where}: {what}")
        if exc.errno in (errno.ENOSPC, errno.EAGAIN, errno.EBUSY):
            return Transient(f"{where}: {what}")
        return Internal(f"{where}: {what}")
    return Internal(f"{type(exc).__name__} in {where} (see the plugin's log)")


_BY_CLASS = {
    types_pb2.ERROR_CLASS_TRANSIENT: Transient,
    types_pb2.ERROR_CLASS_BAD_INPUT: BadInput,
    types_pb2.ERROR_CLASS_CONFLICT: Conflict,
    types_pb2.ERROR_CLASS_NOT_FOUND: NotFound,
    types_pb2.ERROR_CLASS_PERMISSION: Permission,
    types_pb2.ERROR_CLASS_INTERNAL: Internal,
}


def from_proto(err):
    """A protocol Error (from a Host call's answer) as the matching exception."""
    from .values import from_path, from_value

    cls = _BY_CLASS.get(err.error_class, Internal)
    path = from_path(err.path) if err.HasField("path") else None
    partial = from_value(err.partial_state) if err.HasField("partial_state") else None
    return cls(err.message, path, partial_state=partial)

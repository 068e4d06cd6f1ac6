"""trellis_plugin: write a Trellis provider plugin in Python.

    from trellis_plugin import Applied, Field, Provider, Resource, String, serve

The SDK does the protocol (launch, handshake, health, shutdown, values, errors); a
provider is its declarations and callbacks. See sdk/python/README.md.
"""

from ._stubs import plugin_pb2, plugin_pb2_grpc, types_pb2
from .context import Context
from .errors import (
    BadInput,
    Cancelled,
    Conflict,
    Internal,
    NotFound,
    Permission,
    PluginError,
    Transient,
)
from .host import HostClient
from .provider import Applied, Diagnostic, Found, Provider, Resource, ResourceState
from .schema import (
    Any,
    Array,
    Boolean,
    Field,
    Float,
    Integer,
    Map,
    Object,
    Param,
    String,
    Type,
    function,
)
from .serve import serve
from .values import (
    UNKNOWN,
    Sensitive,
    contains_unknown,
    from_path,
    from_value,
    is_unknown,
    reveal,
    to_path,
    to_value,
)

__version__ = "0.1.0"

__all__ = [
    # serving
    "serve", "Provider", "Resource", "Context", "HostClient",
    # results
    "Applied", "Found", "ResourceState", "Diagnostic",
    # schema
    "Field", "Param", "function", "Type", "Any", "String", "Integer", "Float", "Boolean",
    "Array", "Map", "Object",
    # errors
    "PluginError", "Transient", "BadInput", "Conflict", "NotFound", "Permission",
    "Internal", "Cancelled",
    # values
    "UNKNOWN", "Sensitive", "to_value", "from_value", "is_unknown", "contains_unknown",
    "reveal", "to_path", "from_path",
    # generated stubs, for tests and anything the SDK does not cover
    "plugin_pb2", "plugin_pb2_grpc", "types_pb2",
]

"""The protocol's gRPC stubs, generated from proto/trellis/plugin/v1/*.proto on first use.

Generated code is never committed: it is made with grpcio-tools (which bundles protoc, so
this works offline) into `trellis_plugin/_gen/` and regenerated when the .proto files change
(a digest of their contents is kept beside the stubs). protoc writes modules that import
each other as `trellis.plugin.v1.*`, so the output directory goes on sys.path.
"""

import fcntl
import glob
import hashlib
import os
import shutil
import sys
import tempfile

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
DIGEST_FILE = "PROTO_SHA256"


def _proto_dir():
    """$TRELLIS_PROTO_DIR, else the checkout's proto/ (sdk/python/trellis_plugin/../../../proto)."""
    env = os.environ.get("TRELLIS_PROTO_DIR")
    if env:
        return env
    here = PACKAGE_DIR
    for _ in range(4):
        here = os.path.dirname(here)
        candidate = os.path.join(here, "proto")
        if os.path.isfile(os.path.join(candidate, "trellis", "plugin", "v1", "plugin.proto")):
            return candidate
    return None


def _protos(proto_dir):
    return sorted(glob.glob(os.path.join(proto_dir, "trellis", "plugin", "v1", "*.proto")))


def _digest(proto_dir, protos):
    h = hashlib.sha256()
    for path in protos:
        h.update(os.path.relpath(path, proto_dir).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _fresh(out, digest):
    try:
        with open(os.path.join(out, DIGEST_FILE)) as f:
            return f.read().strip() == digest
    except OSError:
        return False


def _writable_out():
    """The package's own _gen/ when it can be written (a checkout), else a user cache."""
    if os.access(PACKAGE_DIR, os.W_OK):
        return os.path.join(PACKAGE_DIR, "_gen")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "trellis-plugin", "stubs")


def _generate(proto_dir, protos, out, digest):
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise ImportError(
            "trellis_plugin needs grpcio-tools to generate its stubs from proto/ "
            "(pip install -r tests/interop/python/requirements.txt)"
        ) from e
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".gen.", dir=parent)
    try:
        # protoc's well-known types (none used today) live inside grpc_tools.
        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        args = ["protoc", "-I", proto_dir, "-I", include,
                f"--python_out={tmp}", f"--grpc_python_out={tmp}", *protos]
        if protoc.main(args) != 0:
            raise ImportError(f"trellis_plugin: protoc failed on {proto_dir} (see stderr)")
        with open(os.path.join(tmp, DIGEST_FILE), "w") as f:
            f.write(digest + "\n")
        # Swap in the new tree; readers only ever see a complete one (or the old one).
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _ensure():
    """The directory holding fresh stubs, generating them if needed."""
    proto_dir = _proto_dir()
    installed = os.path.join(PACKAGE_DIR, "_gen")
    if proto_dir is None or not _protos(proto_dir):
        # No .proto files to compare with (an installed copy): use what was generated.
        if os.path.isdir(os.path.join(installed, "trellis")):
            return installed
        raise ImportError(
            "trellis_plugin cannot find proto/trellis/plugin/v1/*.proto: "
            "set TRELLIS_PROTO_DIR to the Trellis checkout's proto/ directory"
        )
    protos = _protos(proto_dir)
    digest = _digest(proto_dir, protos)
    out = _writable_out()
    if _fresh(out, digest):
        return out
    # Several plugin processes may start at once on a fresh checkout: one generates,
    # the others wait on the lock and then find the stubs fresh.
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _fresh(out, digest):
            _generate(proto_dir, protos, out, digest)
    return out


_out = _ensure()
if _out not in sys.path:
    sys.path.insert(0, _out)

from trellis.plugin.v1 import plugin_pb2, plugin_pb2_grpc, types_pb2  # noqa: E402

__all__ = ["plugin_pb2", "plugin_pb2_grpc", "types_pb2"]

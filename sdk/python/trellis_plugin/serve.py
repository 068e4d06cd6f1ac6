"""serve(): LAUNCH and LIFETIME of the plugin protocol (docs/plugin-protocol.md).

Exit codes, as the Rust SDK's: 0 after a shutdown, 1 when the plugin cannot start, 2 when
run by hand without the engine's environment.
"""

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

from ._stubs import plugin_pb2_grpc
from .service import PROTOCOL_VERSION, Calls, Declaration, PluginService, ProviderService

ENV_NONCE = "TRELLIS_PLUGIN_NONCE"
ENV_VERSIONS = "TRELLIS_PLUGIN_PROTOCOL_VERSIONS"
ENV_SOCKET_DIR = "TRELLIS_PLUGIN_SOCKET_DIR"
# A log level name (`debug`, `info`, ...), as the Rust SDK's TRELLIS_PLUGIN_LOG filter.
ENV_LOG = "TRELLIS_PLUGIN_LOG"

# The engine sends SIGKILL 5 s after SIGTERM (its shutdown grace). In-flight calls may run
# this long, the last CANCEL_GRACE of it with ctx.cancelled set so that they can still
# answer (with partial state) before the SDK gives up on them, remove the socket and exit.
SHUTDOWN_GRACE = 4.0
CANCEL_GRACE = 1.0
# After the last call of a SIGTERM drain has answered, the server and its connections stay up
# this long: its answer may still be on the way, and a client writing to a socket already
# closed fails the call (grpcio: UNAVAILABLE "Stream removed (sendmsg: Broken pipe)").
LINGER = 0.2
# Linux allows 107 bytes in a Unix socket path, macOS 103: stay under both.
MAX_SOCKET_PATH = 100
# gRPC's default receive limit is 4 MiB; the engine sends and accepts up to 64 MiB.
MAX_MESSAGE_BYTES = 64 << 20

log = logging.getLogger("trellis_plugin")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: level, message, target (the logger's name), and the extra
    fields a call adds (call_id, request_id). The engine keeps them as its own log event's
    fields, and stamps the time itself."""

    LEVELS = {"WARNING": "WARN", "CRITICAL": "ERROR"}
    STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

    def format(self, record):
        line = {
            "level": self.LEVELS.get(record.levelname, record.levelname),
            "message": record.getMessage(),
            "target": record.name,
        }
        for key, value in vars(record).items():
            if key not in self.STANDARD and value not in ("", None):
                line[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`INFO kv: message call_id=...` for a person running the plugin by hand."""

    def format(self, record):
        text = f"{record.levelname} {record.name}: {record.getMessage()}"
        for key in ("call_id", "request_id"):
            if getattr(record, key, ""):
                text += f" {key}={getattr(record, key)}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup_logging(json_lines):
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    level = os.environ.get(ENV_LOG, "info").split(",")[0].strip().upper()
    root.setLevel(getattr(logging, "WARNING" if level == "WARN" else level, logging.INFO))
    # gRPC's own Python loggers are noisy at INFO about things the engine handles.
    logging.getLogger("grpc").setLevel(logging.WARNING)


def _exit(code, message=None):
    if message:
        print(message, file=sys.stderr, flush=True)
    logging.shutdown()
    sys.stdout.flush()
    # Handler threads cannot be stopped in Python: do not let one that ignores
    # cancellation keep the process alive.
    os._exit(code)


def _socket_path(directory, name):
    clean = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:40]
    for candidate in (f"{clean}-{os.getpid()}.sock", "p.sock"):
        path = os.path.join(os.path.abspath(directory), candidate)
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
            return path
    return None


def serve(provider, *, max_workers=32, grace=SHUTDOWN_GRACE):
    """Runs the provider until the engine lets it go; never returns. Call it from main."""
    try:
        decl = Declaration(provider)
    except (TypeError, ValueError) as e:
        _exit(1, f"{provider.name or 'plugin'}: the provider's declaration is invalid: {e}")

    nonce = os.environ.get(ENV_NONCE, "")
    sock_dir = os.environ.get(ENV_SOCKET_DIR, "")
    if not nonce and not sock_dir:
        _exit(2, (
            f"This is a Trellis plugin (provider `{provider.name}` {provider.version}).\n"
            f"It is started by the Trellis engine, which sets {ENV_NONCE}, {ENV_VERSIONS}\n"
            f"and {ENV_SOCKET_DIR}, and then talks to it over a Unix socket.\n"
            "Install it where the engine looks for plugins instead of running it by hand."
        ))
    if not nonce or not sock_dir:
        _exit(1, f"plugin launch failed: {ENV_NONCE if not nonce else ENV_SOCKET_DIR} is not set")
    # Absent means the engine speaks version 1 only.
    versions = os.environ.get(ENV_VERSIONS, str(PROTOCOL_VERSION))
    if str(PROTOCOL_VERSION) not in [v.strip() for v in versions.split(",")]:
        _exit(1, f"plugin launch failed: the engine speaks protocol versions `{versions}`; "
                 f"this plugin speaks {PROTOCOL_VERSION}")

    # The engine reads our stderr through a pipe and keeps JSON lines' fields as its own;
    # a person running the plugin in a terminal gets plain lines.
    setup_logging(json_lines=not sys.stderr.isatty())
    path = _socket_path(sock_dir, provider.name)
    if path is None:
        _exit(1, f"plugin launch failed: {ENV_SOCKET_DIR} ({sock_dir}) is too long for a Unix socket path")
    try:
        os.unlink(path)  # a stale socket of an earlier run
    except FileNotFoundError:
        pass

    calls = Calls()
    shared = {}  # the Host client, once a handshake gives its address
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
    )
    plugin_pb2_grpc.add_PluginServicer_to_server(PluginService(decl, nonce, shared), server)
    plugin_pb2_grpc.add_ProviderServicer_to_server(ProviderService(decl, calls, shared), server)
    health_service = health.HealthServicer()
    for name in ("", "trellis.plugin.v1.Plugin", "trellis.plugin.v1.Provider"):
        health_service.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)

    # The socket is created 0600 (only the engine's user may connect), then made so
    # explicitly in case the library ignores the umask.
    old_umask = os.umask(0o177)
    try:
        port = server.add_insecure_port("unix:" + path)
        server.start()
    except RuntimeError as e:
        _exit(1, f"plugin launch failed: cannot listen on {path}: {e}")
    finally:
        os.umask(old_umask)
    if port == 0:  # older grpcio reports a failed bind this way
        _exit(1, f"plugin launch failed: cannot listen on {path}")
    os.chmod(path, 0o600)

    stop = threading.Event()
    stdin_closed = threading.Event()
    why = []

    def on_signal(signum, _frame):
        why.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watch_stdin():
        # The engine holds the write end of our stdin: end-of-file means it is gone, even
        # after a kill -9. Whatever is read is discarded.
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        why.append("stdin closed")
        stdin_closed.set()
        stop.set()

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()

    # The handshake line, once the server listens: exactly one, flushed (a pipe's buffer
    # would otherwise keep it until the engine's launch timeout).
    sys.stdout.write(f"TRELLIS_PLUGIN|{PROTOCOL_VERSION}|unix|{path}\n")
    sys.stdout.flush()
    log.info("serving provider %s %s on %s", provider.name, provider.version, path)

    while not stop.wait(1.0):
        pass
    # From here new calls are refused (as transient: the engine starts the plugin again).
    calls.close()
    log.info("shutting down (%s), %d call(s) in flight", why[0] if why else "?", len(calls))
    health_service.enter_graceful_shutdown()
    if stdin_closed.is_set():
        # Nobody is waiting for answers: stop at once.
        calls.cancel_all()
        server.stop(0).wait()
    else:
        # SIGTERM: in-flight calls may finish within the grace, unless the engine goes away
        # meanwhile (its shutdown closes stdin and signals together). The server stops only
        # once they have answered and LINGER has passed: stopping it closes its connections,
        # and a client still reading the last answer from a closed connection fails the call
        # (stopping first and lingering after failed 6 runs in 100 of the SIGTERM tests).
        end = time.monotonic() + grace
        cancelled = False
        while len(calls) and time.monotonic() < end and not stdin_closed.is_set():
            if not cancelled and time.monotonic() > end - CANCEL_GRACE:
                cancelled = True
                log.warning("%d call(s) still running; cancelling them", len(calls))
                calls.cancel_all()
            time.sleep(0.05)
        if stdin_closed.is_set():
            calls.cancel_all()
            server.stop(0).wait()
        else:
            time.sleep(LINGER)
            # Graceful (GOAWAY without an error): nothing is left to answer but a call the
            # grace cut short.
            server.stop(LINGER).wait()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    log.info("stopped")
    _exit(0)

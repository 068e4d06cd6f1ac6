"""What the interop tests share: a launched plugin process as the engine holds it, the Rust
binaries they talk to, and the runner that prints `NAME: N passed, M failed`.

The process side follows docs/plugin-protocol.md only (environment, handshake line, socket,
lifetime); nothing comes from the Rust code. Each test file adds its own `handshake` on top,
with the stubs it tests against (generated from proto/, or the Python SDK's).
"""

import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
import uuid

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
HANDSHAKE_PREFIX = "TRELLIS_PLUGIN|"
RPC_TIMEOUT = 10
# Bounds on a hang, not speed checks: the machine may be loaded (and a first launch on a
# fresh clone also generates stubs).
STARTUP_TIMEOUT = 60
EXIT_TIMEOUT = 60


class PluginProcess:
    """A plugin launched with the documented environment and a fresh 0700 socket directory.

    `versions=None` launches it without the engine's environment (as a user running it by
    hand would). stdout lines before the handshake line go to `lines`; stderr lines (the
    plugin's logs) to `logs`. `cleanup` lists directories removed on close.
    """

    def __init__(self, argv, versions="1", env=None):
        self.nonce = uuid.uuid4().hex
        # Short path: a Unix socket path must fit in 108 bytes.
        self.sock_dir = tempfile.mkdtemp(prefix="trellis-")
        os.chmod(self.sock_dir, 0o700)
        full_env = dict(os.environ, **(env or {}))
        if versions is not None:
            full_env.update(
                TRELLIS_PLUGIN_NONCE=self.nonce,
                TRELLIS_PLUGIN_PROTOCOL_VERSIONS=versions,
                TRELLIS_PLUGIN_SOCKET_DIR=self.sock_dir,
            )
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            start_new_session=True,
        )
        self.lines = queue.Queue()
        self.logs = []
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.logs.append), daemon=True),
        ]
        for t in self._pumps:
            t.start()
        self.channel = None
        self.socket_path = None
        self.cleanup = [self.sock_dir]

    @staticmethod
    def _pump(stream, sink):
        for raw in stream:
            sink(raw.decode("utf-8", "replace").rstrip("\n"))
        sink(None)  # the end of the stream

    def log_lines(self):
        return [line for line in self.logs if line is not None]

    def handshake_line(self):
        """The handshake line (lines before it are ignored: a banner is allowed), or None when
        stdout closed without one (the plugin exited)."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no handshake line; logs: {self.log_lines()}"
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None or line.startswith(HANDSHAKE_PREFIX):
                return line

    def connect(self):
        """Reads the handshake line and opens a stock grpcio channel on the socket it names."""
        line = self.handshake_line()
        assert line is not None, f"plugin exited before its handshake line; logs: {self.log_lines()}"
        parts = line.split("|")
        assert len(parts) == 4, line
        _, version, network, address = parts
        assert (version, network) == ("1", "unix"), line
        assert os.path.dirname(address) == self.sock_dir, line
        self.socket_path = address
        self.channel = grpc.insecure_channel("unix:" + address)
        grpc.channel_ready_future(self.channel).result(timeout=RPC_TIMEOUT)
        return self

    def wait_exit(self, timeout=EXIT_TIMEOUT):
        """The exit code; fails when the process is still running after `timeout`."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"plugin still running {timeout}s later; logs: {self.log_lines()}"
            ) from None

    def close(self):
        if self.channel is not None:
            self.channel.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # The pipes end with the process: the pumps read to the end before the pipes are
        # closed (closing a pipe a pump is reading raised in its thread).
        for t in self._pumps:
            t.join(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        for d in self.cleanup:
            shutil.rmtree(d, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def rust_binaries():
    """target/debug (or $CARGO_TARGET_DIR/debug) after `cargo build` of the engine and the sim
    provider (a no-op when fresh), unless TRELLIS_TEST_PREBUILT=1 says they are built."""
    if os.environ.get("TRELLIS_TEST_PREBUILT") != "1":
        subprocess.run(
            ["cargo", "build", "--quiet", "-p", "trellis", "-p", "trellis-provider-sim"],
            cwd=ROOT,
            check=True,
        )
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    return os.path.join(target, "debug")


def run_tests(name, namespace):
    """Runs every `test_*` function of `namespace` (a module's globals) in the order they are
    defined; prints
    each result and `NAME: N passed, M failed`. Returns the exit code."""
    tests = [(n, f) for n, f in namespace.items() if n.startswith("test_") and callable(f)]
    passed = failed = 0
    for test, fn in tests:
        try:
            fn()
        except Exception:
            failed += 1
            print(f"FAIL {test}", flush=True)
            traceback.print_exc()
        else:
            passed += 1
            print(f"ok   {test}", flush=True)
    print(f"{name}: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0

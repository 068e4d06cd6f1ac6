"""An HTTP proxy in front of moto that injects what moto is too kind to produce: throttling,
5xx answers and slow answers, for chosen AWS operations. Runs on 127.0.0.1:PORT until stdin
closes.

Control (JSON bodies):
  POST /__faults  {"operation": "CreateQueue", "status": 400, "code": "ThrottlingException",
                   "times": 2, "delay": 0}
      the next `times` calls of the operation get that answer (status 0: forwarded to moto,
      after `delay` seconds)
  GET  /__calls   {"CreateQueue": 3, ...}: calls seen per operation, faulted or not
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

upstream_port = int(sys.argv[2])
lock = threading.Lock()
faults = []  # dicts, consumed in order
calls = {}


def operation(headers, body):
    target = headers.get("X-Amz-Target")
    if target:
        return target.rsplit(".", 1)[-1]
    if body:
        try:
            form = urllib.parse.parse_qs(body.decode("utf-8"))
            if "Action" in form:
                return form["Action"][0]
        except UnicodeDecodeError:
            pass
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path == "/__faults":
            with lock:
                faults.append(json.loads(body))
            return self.reply(200, b"{}")
        if self.path == "/__calls":
            with lock:
                return self.reply(200, json.dumps(calls).encode())
        op = operation(self.headers, body)
        fault = None
        with lock:
            if op:
                calls[op] = calls.get(op, 0) + 1
                for f in faults:
                    if f["operation"] == op and f.get("times", 1) > 0:
                        f["times"] = f.get("times", 1) - 1
                        fault = dict(f)
                        break
        if fault and fault.get("delay"):
            time.sleep(fault["delay"])
        if fault and fault.get("status"):
            code = fault.get("code", "InternalFailure")
            doc = json.dumps({"__type": code, "message": "injected by the test proxy"}).encode()
            return self.reply(
                fault["status"],
                doc,
                [
                    ("Content-Type", "application/x-amz-json-1.0"),
                    ("x-amzn-query-error", code + ";Sender"),
                    ("x-amzn-ErrorType", code),
                ],
            )
        conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        headers["Host"] = "127.0.0.1:%d" % upstream_port
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        out = [(k, v) for k, v in resp.getheaders() if k.lower() not in ("content-length", "transfer-encoding", "connection")]
        conn.close()
        self.reply(resp.status, data, out)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = handle_any


server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
server.daemon_threads = True
threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()

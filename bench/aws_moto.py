#!/usr/bin/env python3
"""AWS provider benchmark: `trellis deploy` of AWS resources against moto, and boto3 making
the same resources one by one against the same moto.

Starts its own moto server (`moto_server -H 127.0.0.1 -p PORT`, AWS's managed policies
loaded: MOTO_IAM_LOAD_MANAGED_POLICIES=true) and a real `trellis serve` (release build, the
bundled `aws` plugin) configured with `[providers.aws] region = "us-east-1"` and `endpoint` =
moto, with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY=testing in its environment. Generates a
blueprint of N resources (default 100: a quarter each of DynamoDB tables, SQS queues, SNS
topics and Lambda functions; the functions' `codeUri` is the absolute path of a directory
holding a one-line Python handler), then, for every run:

1. resets moto (`POST /moto-api/reset`) and warms every service with one untimed read
   (moto builds a service's backend on first use; IAM then loads all of AWS's managed
   policies, which takes seconds and would otherwise land on whichever side came first);
2. times `trellis deploy FILE --instance awsK` (the whole CLI process: plan, then execute,
   watching to the end) and checks with boto3 that every resource exists;
3. times `trellis destroy --instance awsK` (the whole CLI process) and checks that nothing is
   left (tables, queues, topics, functions, and the functions' own IAM roles);
4. resets and warms moto again, then times boto3 doing the same work one call after another
   in this process (clients built before timing, the zip packed once before timing):
   - "boto3 plain create": the create calls only, with the same names, settings and the
     two ownership tags inline (CreateTable, CreateQueue, CreateTopic, CreateFunction);
     every function uses one execution role made once before (CreateRole +
     AttachRolePolicy, timed apart as "shared role");
   - "boto3 plain delete": DeleteTable, GetQueueUrl + DeleteQueue, DeleteTopic,
     DeleteFunction (the shared role stays);
   - after another reset, "boto3 as the engine, create" and "..., delete": the same calls
     the engine's plugin makes (as counted by `--count`), still one at a time. Create: for
     a table DescribeTable (absent), CreateTable, DescribeTable (ACTIVE),
     DescribeTimeToLive, DescribeContinuousBackups, ListTagsOfResource; for a queue
     GetQueueUrl (absent), CreateQueue, GetQueueAttributes; for a topic CreateTopic,
     GetTopicAttributes; for a function GetFunction (absent), GetRole (absent), CreateRole
     (a role of its own, tagged), AttachRolePolicy (AWSLambdaBasicExecutionRole),
     CreateFunction, GetFunction (Active); once, GetCallerIdentity. Delete: DescribeTable,
     DeleteTable, DescribeTable (gone); DeleteQueue; DeleteTopic; DeleteFunction, GetRole,
     ListAttachedRolePolicies, DetachRolePolicy, ListRolePolicies, DeleteRole.

CPU seconds of moto, the engine, the plugin, the CLI and this script are measured around each
timed phase. With `--count` (default on), one more round, untimed, sends the engine's and
boto3's calls through a counting proxy in this process and prints the AWS operations of each.

Usage: python3 bench/aws_moto.py [--runs 3] [--resources 100] [--max-parallel 64]
                                 [--no-count] [--timeout 600]
Build first: cargo build --release -p trellis -p trellis-provider-aws
TRELLIS_BENCH_BIN=DIR: a directory holding copies of `trellis` and `trellis-provider-aws`
(so that a rebuild in target/ cannot change them mid-run); TRELLIS_BENCH_KEEP=1 keeps the
work directory (blueprint, engine and moto logs).
"""

import argparse
import http.client
import io
import json
import os
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import zipfile
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The same convention as bench/deploy.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy import children, cpu_s  # noqa: E402  (the same /proc readers as the deploy bench)

BIN = os.environ.get("TRELLIS_BENCH_BIN") or os.path.join(ROOT, "target", "release")
REGION = "us-east-1"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_EC2_METADATA_DISABLED": "true"}
KINDS = ("table", "queue", "topic", "function")
TYPES = {"table": "aws/dynamodb/table", "queue": "aws/sqs/queue", "topic": "aws/sns/topic",
         "function": "aws/lambda/function"}
HANDLER = "def handler(event, context):\n    return {\"statusCode\": 200, \"body\": \"ok\"}\n"
LAMBDA_TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}
BASIC_POLICY = "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(what, check, timeout, interval=0.1):
    """Calls `check` until it returns a true value, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s: {what}")
        time.sleep(interval)


class Procs:
    """Every process this script starts, each in a session of its own; `stop_all` ends them
    (SIGTERM to that process group, SIGKILL after a grace period)."""

    def __init__(self):
        self.procs = []

    def start(self, args, **kw):
        p = subprocess.Popen(args, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop(self, p, grace=30):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        for p in reversed(list(self.procs)):
            try:
                self.stop(p)
            except Exception as e:  # keep stopping the others
                log(f"stopping {p.args[0]}: {e}")


# ---- moto ------------------------------------------------------------------------------------

class Moto:
    def __init__(self, procs, work):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(work, "moto.log"), "w")
        env = dict(os.environ, MOTO_IAM_LOAD_MANAGED_POLICIES="true")
        exe = shutil.which("moto_server")
        args = ([exe] if exe else [sys.executable, "-m", "moto.server"]) + [
            "-H", "127.0.0.1", "-p", str(self.port)]
        self.proc = procs.start(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)

        def up():
            if self.proc.poll() is not None:
                raise SystemExit(f"moto_server exited ({self.proc.returncode}); see moto.log")
            try:
                with urllib.request.urlopen(self.url + "/moto-api/", timeout=2):
                    return True
            except urllib.error.HTTPError:
                return True
            except OSError:
                return False
        until("moto_server to answer", up, 60, 0.2)

    def reset(self):
        req = urllib.request.Request(self.url + "/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()


def clients(endpoint):
    import boto3
    from botocore.config import Config
    cfg = Config(region_name=REGION, connect_timeout=10, read_timeout=120,
                 retries={"mode": "standard", "max_attempts": 3})
    s = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                              region_name=REGION)
    return {n: s.client(n, endpoint_url=endpoint, config=cfg)
            for n in ("dynamodb", "sqs", "sns", "lambda", "iam", "sts")}


def warm(c):
    """One read per service: moto creates each backend (IAM: its managed policies) on first
    use. Untimed, before either side."""
    c["dynamodb"].list_tables()
    c["sqs"].list_queues()
    c["sns"].list_topics()
    c["lambda"].list_functions()
    c["iam"].get_policy(PolicyArn=BASIC_POLICY)


def inventory(c):
    """What exists in moto: counts of tables, queues, topics, functions and roles."""
    return {
        "table": len(c["dynamodb"].list_tables().get("TableNames", [])),
        "queue": len(c["sqs"].list_queues().get("QueueUrls", [])),
        "topic": len(c["sns"].list_topics().get("Topics", [])),
        "function": len(c["lambda"].list_functions().get("Functions", [])),
        "role": len(c["iam"].list_roles().get("Roles", [])),
    }


# ---- counting proxy --------------------------------------------------------------------------

# REST paths (Lambda) to operation names; anything else is "METHOD /path" with ids starred.
LAMBDA_OPS = [
    ("POST", r"/2015-03-31/functions/?$", "CreateFunction"),
    ("GET", r"/2015-03-31/functions/?$", "ListFunctions"),
    ("GET", r"/2015-03-31/functions/[^/]+/?$", "GetFunction"),
    ("DELETE", r"/2015-03-31/functions/[^/]+/?$", "DeleteFunction"),
    ("GET", r"/2015-03-31/functions/[^/]+/configuration$", "GetFunctionConfiguration"),
    ("PUT", r"/2017-10-31/functions/[^/]+/concurrency$", "PutFunctionConcurrency"),
    ("DELETE", r"/2017-10-31/functions/[^/]+/concurrency$", "DeleteFunctionConcurrency"),
    ("GET", r"/2019-09-30/functions/[^/]+/concurrency$", "GetFunctionConcurrency"),
    ("GET", r"/2017-03-31/tags/.+$", "ListTags"),
    ("POST", r"/2017-03-31/tags/.+$", "TagResource"),
]


def operation(method, path, headers, body):
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
    p = urllib.parse.urlsplit(path).path
    for m, rx, name in LAMBDA_OPS:
        if m == method and re.search(rx, p):
            return name
    return f"{method} {p}"


class CountingProxy:
    """An HTTP proxy in front of moto counting the AWS operations that go through it."""

    def __init__(self, upstream_port):
        self.calls = {}
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: without this, Nagle's algorithm
            # and the client's delayed ACK hold every answer back ~40 ms.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def handle_any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                op = operation(self.command, self.path, self.headers, body)
                with lock:
                    outer.calls[op] = outer.calls.get(op, 0) + 1
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self):
        out, self.calls = self.calls, {}
        return out

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Cpu:
    """CPU seconds used by moto, the engine, its plugins and this process (boto3) since the
    last `take`."""

    def __init__(self, moto_pid, engine_pid):
        self.moto, self.engine = moto_pid, engine_pid
        self.last = self.now()

    def now(self):
        me = os.times()
        return {"moto": cpu_s(self.moto), "engine": cpu_s(self.engine),
                "plugin": sum(cpu_s(p) for p in children(self.engine)),
                "python": me.user + me.system,
                # Children reaped so far: the CLI processes.
                "cli": me.children_user + me.children_system}

    def take(self):
        now = self.now()
        out = {k: now[k] - self.last[k] for k in now}
        self.last = now
        return out


# ---- the engine ------------------------------------------------------------------------------

class Engine:
    """A `trellis serve` on a free port, its data and logs in `work/<name>`."""

    def __init__(self, procs, work, name, endpoint, parallel, timeout):
        self.procs, self.timeout = procs, timeout
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        with open(os.path.join(self.dir, "engine.toml"), "w") as f:
            f.write(f'[providers.aws]\nregion = "{REGION}"\nendpoint = "{endpoint}"\n')
        self.log = open(os.path.join(self.dir, "engine.log"), "w")
        env = dict(os.environ, **CREDS)
        self.proc = procs.start(
            [os.path.join(BIN, "trellis"), "serve", "--listen", "127.0.0.1:0",
             "--data-dir", os.path.join(self.dir, "data"), "--config", "engine.toml",
             "--max-parallel", str(parallel), "--log-level", "info"],
            cwd=self.dir, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True)
        lines = queue.Queue()

        def pump():
            for line in self.proc.stdout:
                lines.put(line)
        threading.Thread(target=pump, daemon=True).start()
        try:
            line = lines.get(timeout=60)
        except queue.Empty:
            raise SystemExit(f"the engine did not start within 60 s; see {self.dir}/engine.log")
        m = re.search(r"listening on (\S+)", line)
        if not m:
            raise SystemExit(f"engine did not start: {line!r}; see {self.dir}/engine.log")
        self.addr = m.group(1)

    def cli(self, *args):
        """Runs a client command; returns (wall seconds, stdout)."""
        t = time.perf_counter()
        try:
            out = subprocess.run(
                [os.path.join(BIN, "trellis"), *args, "--engine", self.addr, "--format", "json"],
                cwd=self.dir, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"`trellis {args[0]}` took more than {self.timeout} s")
        dt = time.perf_counter() - t
        if out.returncode != 0:
            raise SystemExit(f"`trellis {' '.join(args)}` failed ({out.returncode}):\n"
                             f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return dt, out.stdout

    def events(self, instance):
        _, out = self.cli("events", "--instance", instance)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def stop(self):
        self.procs.stop(self.proc)


def event_time(e):
    return datetime.fromisoformat(e["at"].replace("Z", "+00:00")).timestamp()


def timeline(events, op, start_wall, requested, done):
    """Where an operation's time went, from the engine's event timestamps (milliseconds)."""
    evs = [e for e in events if e.get("operationId") == op]
    t0 = next(event_time(e) for e in evs if e["kind"] == "operation.started")
    t_end = next(event_time(e) for e in reversed(evs) if e["kind"] == "operation.finished")
    asked, per_type, spans = {}, {}, []
    first_req = last_done = None
    for e in evs:
        p = e.get("payload") or {}
        if e["kind"] == requested:
            asked[p["resource"]] = event_time(e)
            first_req = first_req or event_time(e)
        elif e["kind"] == done and p.get("resource") in asked:
            last_done = event_time(e)
            per_type.setdefault(p["type"], []).append(event_time(e) - asked[p["resource"]])
            spans.append((asked[p["resource"]], event_time(e)))
    # Time between the first call and the last answer with no provider call in flight.
    idle, reach = 0.0, None
    for a, b in sorted(spans):
        if reach is not None and a > reach:
            idle += a - reach
        reach = b if reach is None else max(reach, b)
    return {
        "idle": idle,
        "before_start": t0 - start_wall,  # CLI start (and, for deploy FILE, the plan)
        "to_first_call": (first_req or t0) - t0,
        "calls": (last_done or t0) - (first_req or t0),
        "after_last": t_end - (last_done or t0),
        "op": t_end - t0,
        "per_type": {t: (statistics.median(v), max(v), len(v)) for t, v in per_type.items()},
    }


# ---- the work --------------------------------------------------------------------------------

def plan_resources(n):
    """(kind, resource name, AWS name) for N resources, the kinds in turn."""
    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        out.append((kind, f"{kind}{i}", f"bench-{kind}-{i}"))
    return out


def blueprint(resources, code_dir):
    out = ["version: 2023-04-20", "resources:"]
    for kind, name, aws in resources:
        out += [f"  {name}:", f"    type: {TYPES[kind]}", "    spec:"]
        if kind == "table":
            out += [f"      tableName: {aws}",
                    "      attributeDefinitions:",
                    "        - attributeName: id",
                    "          attributeType: S",
                    "      keySchema:",
                    "        - attributeName: id",
                    "          keyType: HASH"]
        elif kind == "queue":
            out.append(f"      queueName: {aws}")
        elif kind == "topic":
            out.append(f"      topicName: {aws}")
        else:
            out += [f"      functionName: {aws}",
                    f"      codeUri: {json.dumps(code_dir)}",  # absolute: any engine cwd
                    "      handler: handler.handler",
                    "      runtime: python3.12"]
    return "\n".join(out) + "\n"


def zipped(code_dir):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(os.path.join(code_dir, "handler.py"), "handler.py")
    return buf.getvalue()


def tags_of(instance, name):
    return {"trellis:instance": instance, "trellis:resource": name}


def shared_role(c):
    """One execution role for every function of the plain boto3 run."""
    arn = c["iam"].create_role(RoleName="bench-shared-role",
                               AssumeRolePolicyDocument=json.dumps(LAMBDA_TRUST))["Role"]["Arn"]
    c["iam"].attach_role_policy(RoleName="bench-shared-role", PolicyArn=BASIC_POLICY)
    return arn


def boto_plain(c, resources, code, role, instance):
    for kind, name, aws in resources:
        t = tags_of(instance, name)
        if kind == "table":
            c["dynamodb"].create_table(
                TableName=aws, AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                BillingMode="PAY_PER_REQUEST",
                Tags=[{"Key": k, "Value": v} for k, v in t.items()])
        elif kind == "queue":
            c["sqs"].create_queue(QueueName=aws, tags=t)
        elif kind == "topic":
            c["sns"].create_topic(Name=aws, Tags=[{"Key": k, "Value": v} for k, v in t.items()])
        else:
            c["lambda"].create_function(
                FunctionName=aws, Role=role, Code={"ZipFile": code}, Handler="handler.handler",
                Runtime="python3.12", Tags=t)


def boto_delete(c, resources):
    for kind, name, aws in resources:
        if kind == "table":
            c["dynamodb"].delete_table(TableName=aws)
        elif kind == "queue":
            url = c["sqs"].get_queue_url(QueueName=aws)["QueueUrl"]
            c["sqs"].delete_queue(QueueUrl=url)
        elif kind == "topic":
            c["sns"].delete_topic(TopicArn=f"arn:aws:sns:{REGION}:123456789012:{aws}")
        else:
            c["lambda"].delete_function(FunctionName=aws)


def missing(call, *codes):
    """True when `call` fails with one of the not-found `codes`."""
    from botocore.exceptions import ClientError
    try:
        call()
        return False
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in codes:
            return True
        raise


def boto_as_engine(c, resources, code, instance, timeout):
    """The calls the engine's plugin makes for these creates (counted with `--count`), one
    after another; returns what the deletes need."""
    c["sts"].get_caller_identity()  # the plugin's once, for the account in ARNs
    made = []
    for kind, name, aws in resources:
        t = tags_of(instance, name)
        if kind == "table":
            ddb = c["dynamodb"]
            missing(lambda: ddb.describe_table(TableName=aws), "ResourceNotFoundException")
            ddb.create_table(
                TableName=aws, AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                BillingMode="PAY_PER_REQUEST",
                Tags=[{"Key": k, "Value": v} for k, v in t.items()])
            arn = until(f"table {aws} ACTIVE", lambda: (
                lambda d: d["TableStatus"] == "ACTIVE" and d["TableArn"])(
                ddb.describe_table(TableName=aws)["Table"]), timeout, 0.5)
            ddb.describe_time_to_live(TableName=aws)
            ddb.describe_continuous_backups(TableName=aws)
            ddb.list_tags_of_resource(ResourceArn=arn)
            made.append((kind, aws, None))
        elif kind == "queue":
            missing(lambda: c["sqs"].get_queue_url(QueueName=aws),
                    "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")
            url = c["sqs"].create_queue(QueueName=aws, tags=t)["QueueUrl"]
            c["sqs"].get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
            made.append((kind, aws, url))
        elif kind == "topic":
            arn = c["sns"].create_topic(
                Name=aws, Tags=[{"Key": k, "Value": v} for k, v in t.items()])["TopicArn"]
            c["sns"].get_topic_attributes(TopicArn=arn)
            made.append((kind, aws, arn))
        else:
            missing(lambda: c["lambda"].get_function(FunctionName=aws), "ResourceNotFoundException")
            role = f"{aws}-role"
            missing(lambda: c["iam"].get_role(RoleName=role), "NoSuchEntity")
            arn = c["iam"].create_role(
                RoleName=role, AssumeRolePolicyDocument=json.dumps(LAMBDA_TRUST),
                Tags=[{"Key": k, "Value": v} for k, v in t.items()])["Role"]["Arn"]
            c["iam"].attach_role_policy(RoleName=role, PolicyArn=BASIC_POLICY)
            c["lambda"].create_function(
                FunctionName=aws, Role=arn, Code={"ZipFile": code}, Handler="handler.handler",
                Runtime="python3.12", Tags=t)
            until(f"function {aws} Active", lambda: c["lambda"].get_function(
                FunctionName=aws)["Configuration"].get("State", "Active") == "Active",
                timeout, 0.5)
            made.append((kind, aws, role))
    return made


def boto_delete_as_engine(c, made, timeout):
    """The calls the engine's plugin makes for these destroys, one after another."""
    for kind, aws, extra in made:
        if kind == "table":
            ddb = c["dynamodb"]
            ddb.describe_table(TableName=aws)
            ddb.delete_table(TableName=aws)
            until(f"table {aws} deleted", lambda: missing(
                lambda: ddb.describe_table(TableName=aws), "ResourceNotFoundException"),
                timeout, 0.5)
        elif kind == "queue":
            c["sqs"].delete_queue(QueueUrl=extra)
        elif kind == "topic":
            c["sns"].delete_topic(TopicArn=extra)
        else:
            iam = c["iam"]
            c["lambda"].delete_function(FunctionName=aws)
            iam.get_role(RoleName=extra)
            for p in iam.list_attached_role_policies(RoleName=extra)["AttachedPolicies"]:
                iam.detach_role_policy(RoleName=extra, PolicyArn=p["PolicyArn"])
            for p in iam.list_role_policies(RoleName=extra)["PolicyNames"]:
                iam.delete_role_policy(RoleName=extra, PolicyName=p)
            iam.delete_role(RoleName=extra)


def check_deployed(c, n_of):
    inv = inventory(c)
    for kind in KINDS:
        if inv[kind] != n_of[kind]:
            raise SystemExit(f"after the deploy moto has {inv}, expected {n_of} {kind}s")
    return inv


def check_empty(c):
    inv = inventory(c)
    if any(inv.values()):
        raise SystemExit(f"after the destroy moto still has {inv}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--resources", type=int, default=100)
    ap.add_argument("--max-parallel", type=int, default=64,
                    help="the engine's --max-parallel (its default: 64)")
    ap.add_argument("--no-count", action="store_true",
                    help="skip the untimed round counting each side's AWS calls")
    ap.add_argument("--timeout", type=int, default=600,
                    help="seconds any one command or wait may take")
    args = ap.parse_args()
    for b in ("trellis", "trellis-provider-aws"):
        if not os.path.exists(os.path.join(BIN, b)):
            raise SystemExit(f"{BIN}/{b} is missing; build first: "
                             "cargo build --release -p trellis -p trellis-provider-aws")
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"{e}: pip install 'moto[server]' boto3")

    # A SIGTERM or SIGINT ends the run through `finally`, which stops what was started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    procs = Procs()
    work = tempfile.mkdtemp(prefix="trellis-bench-aws-")
    proxy = None
    try:
        code_dir = os.path.join(work, "code")
        os.makedirs(code_dir)
        with open(os.path.join(code_dir, "handler.py"), "w") as f:
            f.write(HANDLER)
        resources = plan_resources(args.resources)
        n_of = {k: sum(1 for r in resources if r[0] == k) for k in KINDS}
        bp = os.path.join(work, "bench.yaml")
        with open(bp, "w") as f:
            f.write(blueprint(resources, code_dir))
        code = zipped(code_dir)

        moto_srv = Moto(procs, work)
        c = clients(moto_srv.url)
        log(f"moto {moto_srv.url}; work directory {work}")
        engine = Engine(procs, work, "engine", moto_srv.url, args.max_parallel, args.timeout)
        rows = []
        for run in range(1, args.runs + 1):
            inst = f"aws{run}"
            moto_srv.reset()
            warm(c)
            cpu = Cpu(moto_srv.proc.pid, engine.proc.pid)
            wall0 = time.time()
            deploy_s, _ = engine.cli("deploy", bp, "--instance", inst)
            deploy_cpu = cpu.take()
            deployed = check_deployed(c, n_of)
            cpu.take()
            destroy_wall0 = time.time()
            destroy_s, _ = engine.cli("destroy", "--instance", inst)
            destroy_cpu = cpu.take()
            check_empty(c)
            events = engine.events(inst)
            ops = []
            for e in events:
                if e["kind"] == "operation.started" and e["operationId"] not in ops:
                    ops.append(e["operationId"])
            dep_tl = timeline(events, ops[0], wall0, "resource.create_requested",
                              "resource.created")
            des_tl = timeline(events, ops[-1], destroy_wall0, "resource.destroy_requested",
                              "resource.destroyed")

            moto_srv.reset()
            warm(c)
            t = time.perf_counter()
            role = shared_role(c)
            role_s = time.perf_counter() - t
            cpu.take()
            t = time.perf_counter()
            boto_plain(c, resources, code, role, inst)
            plain_s = time.perf_counter() - t
            plain_cpu = cpu.take()
            check_deployed(c, n_of)
            cpu.take()
            t = time.perf_counter()
            boto_delete(c, resources)
            delete_s = time.perf_counter() - t
            delete_cpu = cpu.take()

            moto_srv.reset()
            warm(c)
            cpu.take()
            t = time.perf_counter()
            made = boto_as_engine(c, resources, code, inst, args.timeout)
            mirror_s = time.perf_counter() - t
            mirror_cpu = cpu.take()
            check_deployed(c, n_of)
            cpu.take()
            t = time.perf_counter()
            boto_delete_as_engine(c, made, args.timeout)
            mirror_delete_s = time.perf_counter() - t
            mirror_delete_cpu = cpu.take()
            check_empty(c)

            rows.append({
                "run": run, "deploy": deploy_s, "destroy": destroy_s, "role": role_s,
                "plain": plain_s, "delete": delete_s, "mirror": mirror_s,
                "mirror_delete": mirror_delete_s, "deploy_tl": dep_tl, "destroy_tl": des_tl,
                "roles": deployed["role"],
                "cpu": {"deploy": deploy_cpu, "destroy": destroy_cpu, "plain": plain_cpu,
                        "delete": delete_cpu, "mirror": mirror_cpu,
                        "mirror_delete": mirror_delete_cpu}})
            log(f"run {run}: deploy {deploy_s:.2f} s, destroy {destroy_s:.2f} s; boto3 plain "
                f"{plain_s:.2f} s (+ shared role {role_s:.2f} s), delete {delete_s:.2f} s; "
                f"boto3 as the engine {mirror_s:.2f} s, delete {mirror_delete_s:.2f} s")

        counts = None
        if not args.no_count:
            # Untimed: both sides through the counting proxy, once.
            proxy = CountingProxy(moto_srv.port)
            moto_srv.reset()
            warm(c)
            counter = Engine(procs, work, "engine-count", proxy.url, args.max_parallel,
                             args.timeout)
            proxy.take()
            counter.cli("deploy", bp, "--instance", "count")
            engine_create = proxy.take()
            counter.cli("destroy", "--instance", "count")
            engine_destroy = proxy.take()
            counter.stop()
            pc = clients(proxy.url)
            moto_srv.reset()
            warm(pc)
            proxy.take()
            made = boto_as_engine(pc, resources, code, "count", args.timeout)
            mirror_calls = proxy.take()
            boto_delete_as_engine(pc, made, args.timeout)
            mirror_delete_calls = proxy.take()
            moto_srv.reset()
            warm(pc)
            shared = shared_role(pc)
            proxy.take()
            boto_plain(pc, resources, code, shared, "count")
            plain_calls = proxy.take()
            boto_delete(pc, resources)
            delete_calls = proxy.take()
            counts = [("`trellis deploy`", engine_create),
                      ("boto3 as the engine, create", mirror_calls),
                      ("boto3 plain, create (after the shared role)", plain_calls),
                      ("`trellis destroy`", engine_destroy),
                      ("boto3 as the engine, delete", mirror_delete_calls),
                      ("boto3 plain, delete", delete_calls)]

        report(args, rows, counts)
    finally:
        if proxy:
            proxy.close()
        procs.stop_all()
        if os.environ.get("TRELLIS_BENCH_KEEP"):
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def med_cpu(rows, phase, who):
    return statistics.median(r["cpu"][phase][who] for r in rows)


def report(args, rows, counts):
    n = args.resources
    print(f"\n{n} resources ({n // 4} each of aws/dynamodb/table, aws/sqs/queue, aws/sns/topic, "
          f"aws/lambda/function), engine --max-parallel {args.max_parallel}; boto3 one call "
          "at a time; wall seconds.\n")
    print("| run | `trellis deploy` | boto3 plain create (+ shared role) | boto3 as the engine, "
          "create | `trellis destroy` | boto3 plain delete | boto3 as the engine, delete |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['run']} | {r['deploy']:.2f} | {r['plain']:.2f} (+ {r['role']:.2f}) "
              f"| {r['mirror']:.2f} | {r['destroy']:.2f} | {r['delete']:.2f} "
              f"| {r['mirror_delete']:.2f} |")
    print(f"| median | **{med(rows, 'deploy'):.2f}** | **{med(rows, 'plain'):.2f}** "
          f"(+ {med(rows, 'role'):.2f}) | **{med(rows, 'mirror'):.2f}** "
          f"| **{med(rows, 'destroy'):.2f}** | **{med(rows, 'delete'):.2f}** "
          f"| **{med(rows, 'mirror_delete'):.2f}** |")

    print("\nCPU seconds during each (medians): moto (one Python process), the engine, the aws "
          "plugin, the CLI process, this script (boto3).\n")
    print("| phase | wall | moto | engine | plugin | CLI | boto3 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, phase in (("`trellis deploy`", "deploy"), ("boto3 plain create", "plain"),
                         ("boto3 as the engine, create", "mirror"),
                         ("`trellis destroy`", "destroy"), ("boto3 plain delete", "delete"),
                         ("boto3 as the engine, delete", "mirror_delete")):
        cells = " | ".join(f"{med_cpu(rows, phase, w):.2f}"
                           for w in ("moto", "engine", "plugin", "cli", "python"))
        print(f"| {label} | {med(rows, phase):.2f} | {cells} |")

    print("\nWhere the engine's time went (its event timestamps; seconds): from the CLI's start "
          "to the operation's start (for `deploy FILE`, the plan), from there to the first "
          "provider call, first call to last answer (and how much of that had no provider call "
          "in flight), last answer to the operation's end; per type, median / max from "
          "request to answer.\n")
    types = sorted({t for r in rows for t in r["deploy_tl"]["per_type"]})
    print("| run | op | to op start | to 1st call | calls | (none in flight) | after | "
          + " | ".join(f"`{t}`" for t in types) + " |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | "
          + " | ".join("---:" for _ in types) + " |")
    for r in rows:
        for label, tl in (("deploy", r["deploy_tl"]), ("destroy", r["destroy_tl"])):
            cells = []
            for t in types:
                m = tl["per_type"].get(t)
                cells.append(f"{m[0]:.2f} / {m[1]:.2f}" if m else "—")
            print(f"| {r['run']} | {label} | {tl['before_start']:.2f} | {tl['to_first_call']:.2f} "
                  f"| {tl['calls']:.2f} | {tl['idle']:.2f} | {tl['after_last']:.2f} | "
                  + " | ".join(cells) + " |")

    if counts:
        print("\nAWS calls per side (one more round, untimed, through a counting proxy):\n")
        for label, calls in counts:
            total = sum(calls.values())
            detail = ", ".join(f"{k} {v}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1]))
            print(f"- {label}: {total} calls: {detail}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())

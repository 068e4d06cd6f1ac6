"""Runs moto (an AWS emulator) on 127.0.0.1:PORT until stdin closes.

The test process holds the other end of stdin, so the server goes when the tests do,
however they end.
"""
import os
import sys

# AWS's own managed policies (AWSLambdaBasicExecutionRole, attached to a function's own
# role) exist in moto only with this; it is read when IAM first starts.
os.environ.setdefault("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")

from moto.server import ThreadedMotoServer

port = int(sys.argv[1])
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
server.start()
print("ready", flush=True)
sys.stdin.read()
server.stop()

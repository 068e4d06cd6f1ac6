"""One boto3 call, for tests to check what the provider did with a second AWS client.

usage: boto.py ENDPOINT SERVICE OPERATION JSON_PARAMS  -> the response as JSON on stdout;
an AWS error prints {"Error": {"Code": ..., "Message": ...}} and exits 3.
"""
import json
import sys

import boto3
import botocore.exceptions

endpoint, service, operation, params = sys.argv[1:5]
client = boto3.client(
    service,
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="testing",
    aws_secret_access_key="testing",
)
try:
    out = getattr(client, operation)(**json.loads(params))
except botocore.exceptions.ClientError as e:
    print(json.dumps({"Error": e.response.get("Error", {})}))
    sys.exit(3)
out.pop("ResponseMetadata", None)
print(json.dumps(out, default=str))

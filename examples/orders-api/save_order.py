"""The save-order handler of examples/orders-api.yaml: stores one order in the table."""
import json
import os

import boto3

table = boto3.resource("dynamodb").Table(os.environ["TABLE"])


def handler(event, context):
    order = json.loads(event.get("body") or "{}")
    table.put_item(Item={"order_id": str(order["id"]), "body": json.dumps(order)})
    return {"statusCode": 201, "body": json.dumps({"saved": order["id"]})}

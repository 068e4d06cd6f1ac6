"""The worker of examples/events-app.yaml: one handler for both of its triggers.

- The inbox queue (fed by the events topic) invokes it with batches of SQS records; each
  record's body is the SNS envelope, whose `Message` is what was published.
- The HTTP API invokes it for `POST /events` (payload format 2.0) and gets the event back.
"""
import json


def handler(event, context):
    records = event.get("Records")
    if records is not None:
        for record in records:
            body = json.loads(record.get("body") or "{}")
            print(json.dumps({"event": body.get("Message", body)}))
        return {"batchItemFailures": []}
    body = json.loads(event.get("body") or "{}")
    print(json.dumps({"event": body}))
    return {"statusCode": 202, "body": json.dumps({"accepted": body})}

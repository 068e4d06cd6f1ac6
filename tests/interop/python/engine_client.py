#!/usr/bin/env python3
"""A CI system in Python doing what `trellis deploy --env FILE` does, over the engine API.

Built only from proto/trellis/engine/v1/engine.proto (stubs from gen.sh) and
docs/engine-api.md: it plans a blueprint with an environment (a secret variable,
provider settings for the `pyecho` provider, a property injector), checks what
the plan says about them, executes it, and checks what the instance records.

Run by server/trellis/tests/it/interop_e2e.rs against a real `trellis serve`:

    engine_client.py ADDR STATE_DIR SECRET

Exits 0 when every check holds; prints what failed otherwise.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trellis_interop import ensure_stubs, from_value, map_get, to_value  # noqa: E402

ensure_stubs()

import grpc  # noqa: E402
from trellis.engine.v1 import engine_pb2 as api  # noqa: E402
from trellis.engine.v1 import engine_pb2_grpc as api_grpc  # noqa: E402

BLUEPRINT = b"""version: 2023-04-20
variables:
  greeting:
    type: string
resources:
  hello:
    type: pyecho/message
    spec:
      text: ${variables.greeting}
"""

TIMEOUT = 60


def check(cond, what):
    if not cond:
        print(f"engine_client: FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main():
    addr, state_dir, secret = sys.argv[1], sys.argv[2], sys.argv[3]
    channel = grpc.insecure_channel(addr)
    engine = api_grpc.EngineStub(channel)

    environment = api.Environment(
        name="py-ci",
        providers=to_value({"pyecho": {"stateDir": state_dir}}),
        injectors=to_value({"pyecho/message": {"repeat": 2}}),
    )
    request = api.CreateChangeSetRequest(
        instance="py-ci",
        source=api.BlueprintSource(
            inline=api.InlineBlueprint(file_name="hello.yaml", content=BLUEPRINT)
        ),
        variables=[api.Variable(name="greeting", value=secret, secret=True)],
        environment=environment,
        request_id="py-ci-plan-1",
    )
    cs = engine.CreateChangeSet(request, timeout=TIMEOUT)
    check(cs.status == api.CHANGE_SET_STATUS_PLANNED, f"planned: {cs}")
    fields = {f.path: f for r in cs.resources for f in r.fields}
    check(secret not in str(cs), "the plan quotes the secret")
    check(fields["spec.text"].new.sensitive, "spec.text is not sensitive")
    check(from_value(fields["spec.repeat"].new) == 2, f"spec.repeat: {fields['spec.repeat']}")
    check(fields["spec.repeat"].origin == "environment", "spec.repeat has no origin")
    check(fields["spec.text"].origin == "", "a written field has an origin")

    # A key the provider's config schema lacks is refused, naming it.
    bad = api.CreateChangeSetRequest()
    bad.CopyFrom(request)
    bad.request_id = ""
    bad.environment.providers.CopyFrom(to_value({"pyecho": {"stateDirectory": "/x"}}))
    try:
        engine.CreateChangeSet(bad, timeout=TIMEOUT)
        check(False, "an unknown provider key was accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"code {e.code()}")
        check("providers.pyecho.stateDirectory" in e.details(), e.details())

    op = engine.ExecuteChangeSet(
        api.ExecuteChangeSetRequest(change_set_id=cs.id, request_id="py-ci-exec-1"),
        timeout=TIMEOUT,
    )
    deadline = time.monotonic() + TIMEOUT
    while op.status in (api.OPERATION_STATUS_PENDING, api.OPERATION_STATUS_RUNNING):
        check(time.monotonic() < deadline, "the deploy did not finish")
        time.sleep(0.1)
        op = engine.GetOperation(api.GetOperationRequest(operation_id=op.id), timeout=TIMEOUT)
    check(op.status == api.OPERATION_STATUS_SUCCEEDED, f"deploy: {op}")

    inst = engine.GetInstance(api.GetInstanceRequest(instance="py-ci"), timeout=TIMEOUT)
    check(inst.environment.name == "py-ci", f"environment: {inst.environment}")
    check(inst.environment.digest.startswith("sha256:"), f"digest: {inst.environment.digest}")
    used = map_get(inst.environment.providers, "pyecho")
    check(from_value(map_get(used, "stateDir")) == state_dir, f"providers: {inst.environment}")
    check(secret not in str(inst), "the instance quotes the secret")
    print("engine_client: ok")


if __name__ == "__main__":
    main()

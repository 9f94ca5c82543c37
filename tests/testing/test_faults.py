"""Error faults a test arms on the emulator (``inject``): refusals IAM and the service answer
(AccessDenied, Validation, a Conflict that names no VM) and lists that lag for one caller. Every
refused request reaches the emulator, so its call counts and request log show it."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.config import Config

from rayito_constructs.testing import Fault

from .helpers import error, run


def signed_as(emulator: Any, key: str) -> Any:
    return boto3.client("lambda-microvms", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key="secret",
                        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))


@pytest.mark.parametrize(("kind", "status", "code"), [
    ("AccessDenied", 403, "AccessDeniedException"),
    ("Validation", 400, "ValidationException"),
    ("Conflict", 409, "ConflictException"),
])
def test_refusals_make_no_vm_and_are_logged(emulator, client, image, kind, status, code) -> None:
    emulator.inject("RunMicrovm", kind)
    response = error(lambda: run(client, image, clientToken="t-1"))
    assert response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert response["Error"]["Code"] == code
    assert "resourceId" not in response  # a Conflict that does not name the VM
    assert emulator.microvms() == []
    (record,) = [r for r in emulator.requests if r.operation == "RunMicrovm"]
    assert (record.status, record.error, record.client_token) == (status, code, "t-1")
    # times=1 (the default): the next call goes through, and the token was not used up
    assert run(client, image, clientToken="t-1")["state"] == "PENDING"


def test_access_denied_says_what_iam_says(emulator, client, image) -> None:
    """GT section 1 (Q90): '...not authorized to perform: lambda:RunMicrovm on resource: <image ARN>'."""
    emulator.inject("RunMicrovm", "AccessDenied")
    message = error(lambda: run(client, image))["Error"]["Message"]
    assert "is not authorized to perform: lambda:RunMicrovm on resource: " + image in message


def test_access_denied_names_star_only_where_the_action_is_authorized_on_star(emulator, client, image) -> None:
    """GT section 1: List* and CreateMicrovmImage ([M 2026-10-02] Q114) on ``*``; the image
    operations and UpdateMicrovmImage on the (unversioned) image ARN."""
    for operation, call in (
        ("ListMicrovms", lambda: client.list_microvms(imageIdentifier=image)),
        ("ListMicrovmImages", lambda: client.list_microvm_images()),
        ("CreateMicrovmImage", lambda: client.create_microvm_image(
            name="otra", baseImageArn="arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1",
            buildRoleArn="arn:aws:iam::123456789012:role/build", codeArtifact={"uri": "s3://bucket/key.zip"})),
    ):
        emulator.inject(operation, "AccessDenied")
        assert error(call)["Error"]["Message"].endswith(f"lambda:{operation} on resource: *"), operation
    for operation, call in (
        ("GetMicrovmImageVersion", lambda: client.get_microvm_image_version(imageIdentifier=image, imageVersion="1.0")),
        ("ListTags", lambda: client.list_tags(Resource=image)),
    ):
        emulator.inject(operation, "AccessDenied")
        assert error(call)["Error"]["Message"].endswith(f"lambda:{operation} on resource: {image}"), operation


def test_a_message_replaces_the_default(emulator, client, image) -> None:
    emulator.inject("RunMicrovm", "Validation", message="Value at 'memory' failed to satisfy constraint")
    assert error(lambda: run(client, image))["Error"]["Message"] == "Value at 'memory' failed to satisfy constraint"
    emulator.inject("RunMicrovm", "InternalServer", message="Lost.", retry_after=4)
    response = error(lambda: run(client, image))
    assert response["Error"]["Message"] == "Lost." and response["retryAfterSeconds"] == 4


def test_a_fault_narrowed_to_a_caller_spares_the_others(emulator, image) -> None:
    emulator.inject("RunMicrovm", "AccessDenied", times=None, caller="AKIDRECONCILER")
    reconciler, other = signed_as(emulator, "AKIDRECONCILER"), signed_as(emulator, "AKIDCLIENT")
    assert error(lambda: run(reconciler, image))["Error"]["Code"] == "AccessDeniedException"
    assert run(other, image)["state"] == "PENDING"
    assert error(lambda: run(reconciler, image))["Error"]["Code"] == "AccessDeniedException"
    assert [(r.caller, r.status) for r in emulator.requests if r.operation == "RunMicrovm"] == [
        ("AKIDRECONCILER", 403), ("AKIDCLIENT", 200), ("AKIDRECONCILER", 403)]


@pytest.mark.parametrize("kind", ["lost_response", "crash"])
def test_faults_taken_after_the_work_honour_their_caller(emulator, image, clock, kind) -> None:
    """A lost response (done, answered 500) and a crash (the VM it starts crashes) narrowed to a
    caller hit that caller's requests and only them (they once ignored ``caller=``: never fired)."""
    emulator.inject("RunMicrovm", kind, times=None, caller="AKIDRECONCILER")
    reconciler, other = signed_as(emulator, "AKIDRECONCILER"), signed_as(emulator, "AKIDCLIENT")
    spared = run(other, image)["microvmId"]
    if kind == "lost_response":
        assert error(lambda: run(reconciler, image, clientToken="slot-1"))["Error"]["Code"] == "InternalServerException"
        (hit,) = [vm for vm in emulator.microvms() if vm["clientToken"] == "slot-1"]  # done all the same
        assert hit["caller"] == "AKIDRECONCILER"
        clock.advance(3)
    else:
        hit = {"microvmId": run(reconciler, image)["microvmId"]}
        clock.advance(2 + 15 + 3 + 1)  # running, the exit reported 15 s later, terminating
        assert emulator.state_of(hit["microvmId"]) == "TERMINATED"
    assert emulator.state_of(spared) == "RUNNING"
    assert [(r.caller, r.status) for r in emulator.requests if r.operation == "RunMicrovm"] == [
        ("AKIDCLIENT", 200), ("AKIDRECONCILER", 500 if kind == "lost_response" else 200)]


def test_a_suspend_hook_failure_honours_its_caller(emulator, client, image, clock) -> None:
    emulator.inject("SuspendMicrovm", "suspend_hook_failure", times=None, caller="AKIDRECONCILER")
    reconciler, other = signed_as(emulator, "AKIDRECONCILER"), signed_as(emulator, "AKIDCLIENT")
    first, second = run(client, image)["microvmId"], run(client, image)["microvmId"]
    clock.advance(3)
    other.suspend_microvm(microvmIdentifier=first)
    reconciler.suspend_microvm(microvmIdentifier=second)
    clock.advance(10)
    assert (emulator.state_of(first), emulator.state_of(second)) == ("SUSPENDED", "TERMINATED")


def test_list_lag_omits_young_vms_for_one_caller(emulator, image, clock) -> None:
    lagging, current = signed_as(emulator, "AKIDLAGGING"), signed_as(emulator, "AKIDCURRENT")
    old = run(current, image)["microvmId"]
    clock.advance(40)
    young = run(current, image)["microvmId"]
    fault = emulator.inject("ListMicrovms", "list_lag", seconds=30, times=None, caller="AKIDLAGGING")

    def listed(client: Any) -> set[str]:
        return {i["microvmId"] for i in client.list_microvms(imageIdentifier=image)["items"]}

    assert listed(lagging) == {old}
    assert listed(current) == {old, young}
    assert {i["microvmId"] for i in emulator.microvms()} == {old, young}  # the truth is unchanged
    clock.advance(31)
    assert listed(lagging) == {old, young}
    emulator.remove_fault(fault)
    assert listed(lagging) == {old, young}


def test_list_lag_times_counts_lists(emulator, client, image) -> None:
    vm = run(client, image)["microvmId"]
    emulator.inject("ListMicrovms", "list_lag", seconds=60, times=2)
    lists = [{i["microvmId"] for i in client.list_microvms()["items"]} for _ in range(3)]
    assert lists == [set(), set(), {vm}]


@pytest.mark.parametrize("options", [
    {"operation": "RunMicrovm", "kind": "list_lag", "seconds": 5},
    {"operation": "RunMicrovm", "kind": "AccessDenied", "message": 7},
    {"operation": "RunMicrovm", "kind": "Conflict", "caller": b"key"},
    {"operation": "ListMicrovms", "kind": "list_lag", "seconds": float("nan")},
])
def test_bad_fault_options_are_refused(options) -> None:
    with pytest.raises(ValueError):
        Fault(**options)


def test_faults_armed_over_the_admin_api(emulator, client, image) -> None:
    import json
    import urllib.request

    body = json.dumps({"operation": "RunMicrovm", "kind": "AccessDenied", "caller": "testing"}).encode()
    request = urllib.request.Request(f"{emulator.endpoint_url}/_emulator/faults", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    assert error(lambda: run(client, image))["Error"]["Code"] == "AccessDeniedException"

"""The recorder of AWS calls (``rayito_constructs.testing.aws_calls``): what it keeps of a real
boto3 client's calls against the emulator and moto, never a secret's value; how a call maps to
the IAM requests it is authorized as; the CLI's recorder through ``sitecustomize``. And the two
image-build operations the product's ``rayito image publish`` reads after a build."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import boto3
import pytest

from rayito_constructs.testing import MicrovmsEmulator, VirtualClock
from rayito_constructs.testing.aws_calls import (
    RECORD_FILE_ENV,
    SITE_DIR,
    AwsCallRecorder,
    IamRequest,
    load,
    requests_of,
    vm_images,
)

from ..emulator_helpers import microvms_client

ACCOUNT = "123456789012"
IMAGE = f"arn:aws:lambda:us-east-1:{ACCOUNT}:microvm-image:mi-agente"


def test_every_call_of_every_new_session_is_recorded_and_mapped(moto_endpoint, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto_endpoint)
    with MicrovmsEmulator(clock=VirtualClock(), seed=3, consistency_seconds=0) as emu, AwsCallRecorder() as recorder:
        image = emu.create_image("mi-agente", hooks=True)
        # A session made after install() (boto3.client() would use boto3's default session, which
        # another test of the process may have made, and marked, before this recorder existed).
        client = boto3.Session(region_name="us-east-1", aws_access_key_id="testing",
                               aws_secret_access_key="testing").client("lambda-microvms", endpoint_url=emu.endpoint_url)
        vm = client.run_microvm(imageIdentifier=image, runHookPayload="{\"token\": \"x\"}")["microvmId"]
        client.get_microvm(microvmIdentifier=vm)
        secrets = boto3.Session(region_name="us-east-1", aws_access_key_id="testing",
                                aws_secret_access_key="testing").client("secretsmanager")
        # A name of this test's own: moto's backends are the worker process's, shared by every module.
        arn = secrets.create_secret(Name="rayito/recorded-key", SecretString="hunter2")["ARN"]
        secrets.get_secret_value(SecretId="rayito/recorded-key")
        with pytest.raises(secrets.exceptions.ResourceNotFoundException):
            secrets.get_secret_value(SecretId="rayito/absent")
    records = recorder.records
    assert [(r["service"], r["op"], r["status"], r["error"]) for r in records] == [
        ("lambda-microvms", "RunMicrovm", 200, None), ("lambda-microvms", "GetMicrovm", 200, None),
        ("secretsmanager", "CreateSecret", 200, None), ("secretsmanager", "GetSecretValue", 200, None),
        ("secretsmanager", "GetSecretValue", 404, "ResourceNotFoundException")]
    assert {r["region"] for r in records} == {"us-east-1"}
    text = json.dumps(records)
    assert "hunter2" not in text and '\\"token\\"' not in text  # values and payloads are never kept
    assert records[0]["params"]["runHookPayload"] == "<redacted>"

    images = vm_images(records)
    assert images == {vm: image}
    mapped = [r for record in records for r in requests_of(record, images, account=ACCOUNT)]
    assert [(r.action, r.resource) for r in mapped] == [
        ("lambda:RunMicrovm", IMAGE),
        ("lambda:PassNetworkConnector", "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:HTTP_INGRESS"),
        ("lambda:PassNetworkConnector", "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:INTERNET_EGRESS"),
        ("lambda:GetMicrovm", IMAGE),  # a VM is authorized through its image
        ("secretsmanager:CreateSecret", arn),
        ("secretsmanager:GetSecretValue", arn),  # the full ARN, from the answer
        ("secretsmanager:GetSecretValue", f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:rayito/absent-AbCdEf"),
    ]


@pytest.mark.parametrize("record, expected", [
    ({"service": "lambda-microvms", "op": "CreateMicrovmImage",
      "params": {"name": "x", "buildRoleArn": "arn:aws:iam::123456789012:role/b"}},
     [("lambda:CreateMicrovmImage", "*", {}),
      ("lambda:PassNetworkConnector", "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:INTERNET_EGRESS", {}),
      ("iam:PassRole", "arn:aws:iam::123456789012:role/b", {"iam:PassedToService": "lambda.amazonaws.com"})]),
    ({"service": "lambda-microvms", "op": "UpdateMicrovmImage", "params": {"imageIdentifier": f"{IMAGE}:3.0"}},
     [("lambda:UpdateMicrovmImage", IMAGE, {}),
      ("lambda:PassNetworkConnector", "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:INTERNET_EGRESS", {})]),
    ({"service": "lambda-microvms", "op": "ListMicrovms", "params": {"imageIdentifier": IMAGE}}, [("lambda:ListMicrovms", "*", {})]),
    ({"service": "s3", "op": "HeadObject", "params": {"Bucket": "b", "Key": "rayito/images/x.zip"}},
     [("s3:GetObject", "arn:aws:s3:::b/rayito/images/x.zip", {})]),
    ({"service": "s3", "op": "HeadBucket", "params": {"Bucket": "b"}}, [("s3:ListBucket", "arn:aws:s3:::b", {})]),
    ({"service": "dynamodb", "op": "BatchGetItem", "params": {"RequestItems": {"t": {}}}},
     [("dynamodb:BatchGetItem", f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/t", {})]),
    ({"service": "ssm", "op": "GetParameter", "params": {"Name": "/rayito/agents/x/recipe"}},
     [("ssm:GetParameter", f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter/rayito/agents/x/recipe", {})]),
    ({"service": "logs", "op": "DescribeLogStreams", "params": {"logGroupName": "/rayito/x"}},
     [("logs:DescribeLogStreams", f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/rayito/x:*", {})]),
])
def test_how_a_call_is_authorized(record, expected) -> None:
    found = requests_of({**record, "region": "us-east-1"}, {}, account=ACCOUNT)
    assert [(r.action, r.resource, dict(r.context)) for r in found] == expected


def test_what_is_not_mapped_is_an_error_never_a_guess() -> None:
    with pytest.raises(KeyError, match="ec2:RunInstances"):
        requests_of({"service": "ec2", "op": "RunInstances", "params": {}}, {}, account=ACCOUNT)
    with pytest.raises(KeyError, match="no answer named its image"):
        requests_of({"service": "lambda-microvms", "op": "GetMicrovm", "params": {"microvmIdentifier": "microvm-1"}},
                    {}, account=ACCOUNT)
    (caller,) = requests_of({"service": "sts", "op": "GetCallerIdentity", "params": {}}, {}, account=ACCOUNT)
    assert caller == IamRequest("sts:GetCallerIdentity", "*", operation="sts:GetCallerIdentity", exempt=True)


def test_the_cli_records_through_sitecustomize(tmp_path) -> None:
    """A subprocess with SITE_DIR first on PYTHONPATH appends its calls to the named file."""
    out = tmp_path / "calls.jsonl"
    with MicrovmsEmulator(clock=VirtualClock(), seed=3) as emu:
        code = ("import boto3; boto3.client('lambda-microvms', region_name='us-east-1', aws_access_key_id='t', "
                f"aws_secret_access_key='t', endpoint_url={emu.endpoint_url!r}).list_microvms()")
        env = {**os.environ, RECORD_FILE_ENV: str(out),
               "PYTHONPATH": os.pathsep.join([str(SITE_DIR), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
        subprocess.run([sys.executable, "-c", code], env={**env, RECORD_FILE_ENV: ""}, check=True, timeout=60)
    assert [(r["op"], r["status"]) for r in load(out)] == [("ListMicrovms", 200)]
    assert load(tmp_path / "none.jsonl") == []


def test_image_builds_are_listed_and_read() -> None:
    """What ``rayito image publish`` reads after a build (``cli/_publish.py`` ``latest_build``)."""
    clock = VirtualClock()
    with MicrovmsEmulator(clock=clock, seed=3, image_build_seconds=10) as emu:
        client = microvms_client(emu.endpoint_url)
        made = client.create_microvm_image(
            name="built", baseImageArn="arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1", baseImageVersion="1",
            codeArtifact={"uri": "s3://artifacts-b/rayito/images/x.zip"}, resources=[{"minimumMemoryInMiB": 2048}],
            buildRoleArn="arn:aws:iam::123456789012:role/b")
        arn, version = made["imageArn"], made["imageVersion"]
        (building,) = client.list_microvm_image_builds(imageIdentifier=arn, imageVersion=version)["items"]
        assert building["buildState"] == "IN_PROGRESS"
        clock.advance(11)
        build = client.get_microvm_image_build(imageIdentifier=arn, imageVersion=version, buildId=building["buildId"])
        assert (build["buildState"], build["architecture"]) == ("SUCCESSFUL", "ARM_64")
        with pytest.raises(client.exceptions.ResourceNotFoundException):
            client.get_microvm_image_build(imageIdentifier=arn, imageVersion=version, buildId="build-9")


def test_a_test_says_what_builds_of_an_image_run(tmp_path) -> None:
    """The emulator cannot read a build's S3 artifact: ``builds_run`` says it is the product's
    rayd with this app; a version built without it runs nothing."""
    with MicrovmsEmulator(host_vms=True, image_build_seconds=0.1, pending_seconds=0.1) as emu:
        client = microvms_client(emu.endpoint_url)
        common = dict(baseImageArn="arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1", baseImageVersion="1",
                      codeArtifact={"uri": "s3://artifacts-b/rayito/templates/x.zip"}, resources=[{"minimumMemoryInMiB": 2048}],
                      buildRoleArn="arn:aws:iam::123456789012:role/b")
        client.create_microvm_image(name="plain", **common)
        emu.builds_run("agent", app_dir=tmp_path)
        client.create_microvm_image(name="agent", **common)
        with emu._lock:  # the versions' runtimes, as the VMs would get them
            runtimes = {name: emu._images[name].versions["1.0"].runtime for name in ("plain", "agent")}
        assert not runtimes["plain"].rayd
        assert runtimes["agent"].rayd and runtimes["agent"].app_dir == tmp_path.resolve()
        with pytest.raises(ValueError, match="app_dir"):
            emu.builds_run("other", app_dir=tmp_path / "missing")

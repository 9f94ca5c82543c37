"""The product's own paths, run against moto and the MicroVMs emulator with every AWS call recorded.

One world per test module: moto (STS, SSM, Secrets Manager, DynamoDB, S3, Logs, CloudFormation),
the emulator with VMs that run the stand-in rayd behind its TLS front, an agent project the
product scaffolds (``rayito agent init --runtime custom``, a bedrock gateway whose secret is
``provider-key``, a ``secret_env`` id, a warm slot), and the fleet stack this library synthesizes
for it (``FleetStack``, with the metadata index). What the world holds is what the stack says:
the metadata index is made from the template's own properties (``contract_support.provision``),
the build role ``rayito image publish`` passes is the stack's, the access token is in the secret
the stack names.

Each path is the product's unmodified code: the CLI (``python -m rayito.cli``) in a subprocess
recorded by ``aws_calls``' ``sitecustomize``, or its classes in this process with the recorder
installed (the seams the product documents for tests: ``TransportSettings`` and the fleet's
``directory=``/``transport_factory=``, ``emulator.vm_host.seams``). The setup a path needs (an
admin publishing the base image, the secrets the project names) is done outside the recording.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import boto3

from rayito_constructs.testing import MicrovmsEmulator
from rayito_constructs.testing.aws_calls import RECORD_FILE_ENV, SITE_DIR, AwsCallRecorder, IamRequest, load, requests_of, vm_images

ACCOUNT = "123456789012"
REGION = "us-east-1"
FLEET = "eco"
BUCKET = f"rayito-artifacts-{ACCOUNT}-{REGION}"
PRODUCT_BUILD_ROLE = f"arn:aws:iam::{ACCOUNT}:role/rayito-m0-build-{REGION}"
ROLES = {"launcher": "SandboxLauncherPolicy", "publisher": "ImagePublisherPolicy", "caller": "CallerPolicy"}
EXTRA_TOML = """
[secret_env]
OPENAI_API_KEY = "team/openai"

[serve]
max_concurrency = 1
queue_max = 1
queue_timeout_seconds = 1

[scaling]
min_vms = 1
max_vms = 3
warm_vms = 1
scale_in_after_seconds = 60
"""
#: A base image's zip as ``rayito image zip`` makes one: a Dockerfile that ends in ENTRYPOINT
#: (``Template.build`` refuses a base without one).
DOCKERFILE = 'FROM public.ecr.aws/amazonlinux/amazonlinux:2023\nENTRYPOINT ["/usr/local/bin/rayd"]\n'


@dataclass
class PathRun:
    """One path of the product, what ran it and every AWS call it made."""

    name: str
    role: str
    how: str
    records: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = ""
    seconds: float = 0.0

    def requests(self, images: Mapping[str, str]) -> list[IamRequest]:
        seen: dict[Any, IamRequest] = {}
        for record in self.records:
            for request in requests_of(record, images, account=ACCOUNT, region=REGION):
                seen.setdefault(request.key(), request)
        return list(seen.values())


def rayd_zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        info = zipfile.ZipInfo("Dockerfile", date_time=(1980, 1, 1, 0, 0, 0))
        archive.writestr(info, DOCKERFILE)
    return out.getvalue()


class Resolver:
    """Answers a template's intrinsics with the world's values (the template is the stack's)."""

    def __init__(self, template: Mapping[str, Any], values: Mapping[tuple[str, str], str]) -> None:
        self.resources = template["Resources"]
        self.values = dict(values)

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.value(v) for v in node]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            (key, inner), = node.items()
            if key == "Ref":
                pseudo = {"AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::Partition": "aws",
                          "AWS::URLSuffix": "amazonaws.com"}
                if inner in pseudo:
                    return pseudo[inner]
                return self._attribute(inner, "Ref")
            if key == "Fn::GetAtt":
                logical, attribute = inner if isinstance(inner, list) else inner.split(".", 1)
                return self._attribute(logical, attribute)
            if key == "Fn::Join":
                separator, parts = inner
                return separator.join(str(self.value(p)) for p in parts)
        return {k: self.value(v) for k, v in node.items()}

    def _attribute(self, logical: str, attribute: str) -> str:
        if (logical, attribute) in self.values:
            return self.values[(logical, attribute)]
        kind = self.resources[logical]["Type"]
        if kind == "AWS::IAM::Role" and attribute == "Arn":
            return f"arn:aws:iam::{ACCOUNT}:role/{logical}"
        if attribute.endswith("ImageArn"):
            return f"arn:aws:lambda:{REGION}:{ACCOUNT}:microvm-image:{FLEET}"
        raise KeyError(f"the test world has no value for {logical}.{attribute} ({kind})")


def policy_documents(template: Mapping[str, Any], resolver: Resolver) -> dict[str, dict[str, Any]]:
    """The fleet's three managed policies, resolved: ``{SandboxLauncherPolicy: document, ...}``."""
    found: dict[str, dict[str, Any]] = {}
    for logical, resource in template["Resources"].items():
        if resource["Type"] != "AWS::IAM::ManagedPolicy":
            continue
        for kind in ROLES.values():
            if str(resource["Properties"].get("Description", "")).startswith(f"Rayito {kind}"):
                found[kind] = resolver.value(resource["Properties"]["PolicyDocument"])
    assert set(found) == set(ROLES.values()), found.keys()
    return found


class Runner:
    """Runs paths and keeps their calls: :meth:`cli` for the product's CLI, :meth:`inprocess` for
    its classes."""

    def __init__(self, recorder: AwsCallRecorder, env: Mapping[str, str], workdir: Path) -> None:
        self.recorder = recorder
        self.env = dict(env)
        self.workdir = workdir
        self.paths: list[PathRun] = []

    def cli(self, name: str, role: str, *args: str, timeout: float = 300, expect: int = 0,
            env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
        out = self.workdir / f"{len(self.paths)}.jsonl"
        out.unlink(missing_ok=True)
        started = time.monotonic()
        environment = {**self.env, **(env or {}), RECORD_FILE_ENV: str(out),
                       "PYTHONPATH": os.pathsep.join(p for p in (str(SITE_DIR), os.environ.get("PYTHONPATH", "")) if p)}
        done = subprocess.run([sys.executable, "-m", "rayito.cli", *args], env=environment, capture_output=True,
                              text=True, timeout=timeout, cwd=self.workdir)
        assert done.returncode == expect, f"{name}: rayito {' '.join(args)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        self.paths.append(PathRun(name, role, "rayito " + " ".join(_shown(a) for a in args), load(out),
                                  (done.stdout + done.stderr).strip()[-300:], time.monotonic() - started))
        return done

    def inprocess(self, name: str, role: str, how: str, body: Callable[[], Any]) -> Any:
        start, started = self.recorder.mark(), time.monotonic()
        result = body()
        self.paths.append(PathRun(name, role, how, self.recorder.since(start), seconds=time.monotonic() - started))
        return result

    def images(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for path in self.paths:
            found.update(vm_images(path.records))
        return found


def _shown(arg: str) -> str:
    """A path argument as the docs show it (the test's folders are temporary)."""
    if arg.startswith("/"):
        return f"<{Path(arg).name}>"
    return arg


@dataclass
class World:
    moto: str
    emulator: MicrovmsEmulator
    folder: Path
    session: Any
    token: str
    template: dict[str, Any]
    resolver: Resolver
    table: str
    env: dict[str, str]

    @property
    def documents(self) -> dict[str, dict[str, Any]]:
        return policy_documents(self.template, self.resolver)


def aws_env(moto: str) -> dict[str, str]:
    """The product's environment against moto (the MicroVMs endpoint is the emulator's)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "GRPC_", "RAYITO_"))}
    env.update({"AWS_ENDPOINT_URL": moto, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"})
    return env


def each_line(text: str) -> Iterator[str]:
    yield from (line for line in text.splitlines() if line.strip())


def dump(paths: list[PathRun], target: Path) -> None:
    """Every recorded call, for a person reading a failure."""
    target.write_text(json.dumps([{"path": p.name, "role": p.role, "how": p.how, "seconds": round(p.seconds, 1),
                                   "outcome": p.outcome, "records": p.records} for p in paths],
                                 indent=1, default=str))


def boto_session() -> Any:
    return boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")

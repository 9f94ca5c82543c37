"""A deployed fleet without an AWS account: ``cdk deploy`` of the synthesized stack into moto.

* The stack is synthesized by the library as ``cdk synth`` would (``FleetStack``), its file assets
  are zipped and uploaded to the bootstrap bucket in moto S3 (what ``cdk-assets`` does), and the
  template is created as a stack by **moto's CloudFormation**: outputs, logical ids, physical ids,
  IAM policy documents, tables, queues, functions and their environment are moto's, from the
  template as synthesized.
* Three resource types moto's CloudFormation does not know get a provider here, in the process
  that runs moto's server: ``AWS::Lambda::MicrovmImage`` (created in the MicroVMs emulator through
  its CreateMicrovmImage, from the template's properties), ``Custom::RayitoRecipe`` (the library's
  own recipe writer, ``lambdas/recipe_writer``, writing to moto's SSM) and ``AWS::CloudWatch::Alarm``
  (PutMetricAlarm into moto's CloudWatch). Types moto skips (the queue policy, the event invoke
  config) are simply absent, as in a partially deployed stack; schedules and the lifecycle
  resources of issue #13 only resolve their references (``ScheduleResource``, ``LifecycleResource``).
* The reconciler is the real handler (``lambdas/reconciler/index.py``) with the environment the
  stack gave its function, talking to the emulator and moto; its output goes to its log group with
  the platform report line Lambda adds (JSON log format).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import boto3
import botocore.session
from moto.cloudformation import parsing
from moto.core.common_models import CloudFormationModel

from rayito_constructs.testing import MicrovmsEmulator
from rayito_constructs.verify import Options, verify

from .projects import scratch
from .verify_fakes import IamSimulator, ImageVersions, ServiceQuotas

ACCOUNT = "123456789012"
REGION = "us-east-1"
_CURRENT: dict[str, "World"] = {}
_SHARED: dict[str, Any] = {}
_SYNTH_CACHE: dict[str, "Assembly"] = {}
_SYNTH_ROOT = scratch("verify-synth-")


def _camel(key: str) -> str:
    return key[:1].lower() + key[1:] if key != "CloudWatch" else "cloudWatch"


def _api_shape(value: Any) -> Any:
    """CloudFormation properties of AWS::Lambda::MicrovmImage as the CreateMicrovmImage API takes them."""
    if isinstance(value, list):
        return [_api_shape(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key == "EnvironmentVariables":
            out["environmentVariables"] = {e["Key"]: e["Value"] for e in item} if item else None
        elif key == "Disabled":
            if item:
                out["disabled"] = {}
        else:
            out[_camel(key)] = _api_shape(item)
    return {k: v for k, v in out.items() if v not in (None, [], "")}


class MicrovmImageResource(CloudFormationModel):
    """``AWS::Lambda::MicrovmImage`` for moto's CloudFormation: CreateMicrovmImage in the emulator."""

    __module__ = "tests.verify_world"

    def __init__(self, arn: str, version: str) -> None:
        self.arn, self.version = arn, version

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::Lambda::MicrovmImage"

    @staticmethod
    def cloudformation_name_type() -> str:
        return "Name"

    @property
    def physical_resource_id(self) -> str:
        return self.arn

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr in ("ImageArn", "LatestActiveImageVersion", "State", "CreatedAt", "UpdatedAt",
                        "LatestFailedImageVersion")

    def get_cfn_attribute(self, attr: str) -> Any:
        return {"ImageArn": self.arn, "LatestActiveImageVersion": self.version, "State": "CREATED"}.get(attr, "")

    @classmethod
    def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: dict[str, Any],
                                        account_id: str, region_name: str, **kwargs: Any) -> "MicrovmImageResource":
        world = _CURRENT["world"]
        request = _api_shape(cloudformation_json["Properties"])
        request.pop("tags", None)
        created = world.microvms.create_microvm_image(**request)
        version = created.get("imageVersion") or "1.0"
        if "ListMicrovmImageVersions" in _emulated():
            world.versions.add_base(request["baseImageArn"])
        else:
            world.versions.add(created["imageArn"], version, baseImageArn=request["baseImageArn"],
                               baseImageVersion=request.get("baseImageVersion"), buildRoleArn=request["buildRoleArn"],
                               codeArtifact=request["codeArtifact"],
                               resources=request.get("resources") or [{"minimumMemoryInMiB": 2048}])
        return cls(created["imageArn"], version)


class RecipeResource(CloudFormationModel):
    """``Custom::RayitoRecipe``: the library's recipe writer (its ``handle``) against moto's SSM."""

    __module__ = "tests.verify_world"

    def __init__(self, physical: str, data: dict[str, Any]) -> None:
        self.physical, self.data = physical, data

    @staticmethod
    def cloudformation_type() -> str:
        return "Custom::RayitoRecipe"

    @property
    def physical_resource_id(self) -> str:
        return self.physical

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return True

    def get_cfn_attribute(self, attr: str) -> Any:
        return self.data.get(attr, "")

    @classmethod
    def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: dict[str, Any],
                                        account_id: str, region_name: str, **kwargs: Any) -> "RecipeResource":
        from rayito_constructs._lambdas.recipe_writer import index as writer

        world = _CURRENT["world"]
        properties = {k: v for k, v in cloudformation_json["Properties"].items() if k != "ServiceToken"}
        event = {"RequestType": "Create", "ResourceProperties": properties, "StackId": kwargs.get("StackId", ""),
                 "RequestId": str(uuid.uuid4()), "LogicalResourceId": kwargs.get("LogicalId", "Recipe"),
                 "ResourceType": "Custom::RayitoRecipe"}
        name = str(properties.get("ParameterName", ""))
        if hasattr(writer, "read_document"):
            # The writer that reads the recipe document from the stack's assets: its own handle,
            # outcome as the Lambda answers it (a failed save never fails the deploy).
            fleet = name.split("/")[3] if name.count("/") == 4 else ""
            clients = writer.Clients(ssm=world.moto("ssm"), s3=world.moto("s3"))
            try:
                if world.recipe_fault is not None:
                    raise writer.NotSaved(*world.recipe_fault)
                outcome = writer.handle(event, fleet, clients, writer._Deadline(None))
            except writer.NotSaved as exc:
                outcome = {"Outcome": exc.code, "Saved": "false", "Reason": exc.reason}
            for key in ("Encoding", "ImageVersion"):
                outcome.setdefault(key, "")
            outcome.setdefault("Bytes", "0")
            outcome["ParameterName"] = name
            return cls(name, outcome)
        result = writer.handle(event, world.moto("ssm"))
        return cls(result.get("PhysicalResourceId", name), result.get("Data", {}))


class AlarmResource(CloudFormationModel):
    """``AWS::CloudWatch::Alarm``: PutMetricAlarm into moto's CloudWatch."""

    __module__ = "tests.verify_world"

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::CloudWatch::Alarm"

    @staticmethod
    def cloudformation_name_type() -> str:
        return "AlarmName"

    @property
    def physical_resource_id(self) -> str:
        return self.name

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr == "Arn"

    def get_cfn_attribute(self, attr: str) -> Any:
        return f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{self.name}"

    @classmethod
    def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: dict[str, Any],
                                        account_id: str, region_name: str, **kwargs: Any) -> "AlarmResource":
        world = _CURRENT["world"]
        props = dict(cloudformation_json["Properties"])
        props.pop("AlarmName", None)
        world.moto("cloudwatch").put_metric_alarm(AlarmName=resource_name, **props)
        return cls(resource_name)


class ScheduleResource(CloudFormationModel):
    """``AWS::Scheduler::Schedule``: its name and ARN only, so what refers to it resolves (the
    fleet's teardown names the reconciler's schedule); nothing is created in moto's scheduler, so
    the schedule stays absent to verify, as before."""

    __module__ = "tests.verify_world"

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::Scheduler::Schedule"

    @staticmethod
    def cloudformation_name_type() -> str:
        return "Name"

    @property
    def physical_resource_id(self) -> str:
        return self.name

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr == "Arn"

    def get_cfn_attribute(self, attr: str) -> Any:
        return f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/default/{self.name}"

    @classmethod
    def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: dict[str, Any],
                                        account_id: str, region_name: str, **kwargs: Any) -> "ScheduleResource":
        return cls(resource_name)


class LifecycleResource(CloudFormationModel):
    """``Custom::RayitoFleetTeardown`` and ``Custom::RayitoImagePruner`` (issue #13) answering a
    create as their functions do (``armed``; nothing to prune before the image exists). Their
    handlers are tested through their entry points in tests/test_fleet_teardown_handler.py and
    tests/test_image_pruner_handler.py; here they only let the stack deploy."""

    __module__ = "tests.verify_world"

    def __init__(self, physical: str, data: dict[str, Any]) -> None:
        self.physical, self.data = physical, data

    @staticmethod
    def cloudformation_type() -> str:
        return "Custom::RayitoFleetTeardown"

    @property
    def physical_resource_id(self) -> str:
        return self.physical

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return True

    def get_cfn_attribute(self, attr: str) -> Any:
        return self.data.get(attr, "")

    @classmethod
    def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: dict[str, Any],
                                        account_id: str, region_name: str, **kwargs: Any) -> "LifecycleResource":
        props = cloudformation_json["Properties"]
        if "FleetName" in props:
            return cls(f"rayito-teardown:{props['FleetName']}@{props.get('LedgerTable', '')}", {"Outcome": "armed"})
        return cls(f"rayito-pruner:{props.get('ImageName', '')}", {"Outcome": "no_image"})


_original_class_for = parsing.resource_class_from_type


def _class_for(resource_type: str) -> Any:
    if resource_type == "Custom::RayitoRecipe":
        return RecipeResource
    if resource_type in ("Custom::RayitoFleetTeardown", "Custom::RayitoImagePruner"):
        return LifecycleResource
    return _original_class_for(resource_type)


def install_providers() -> None:
    parsing.resource_class_from_type = _class_for
    parsing.get_model_map.cache_clear()
    parsing.get_name_type_map.cache_clear()


# ---------------------------------------------------------------------------------------------
# Synthesis


class Assembly:
    """One synthesized fleet stack: its template and its cloud assembly folder."""

    def __init__(self, outdir: Path, stack_name: str) -> None:
        self.outdir = outdir
        self.stack_name = stack_name
        self.template = json.loads((outdir / f"{stack_name}.template.json").read_text())
        self.assets = json.loads((outdir / f"{stack_name}.assets.json").read_text())


def synth(key: str, build: Callable[..., str]) -> Assembly:
    """Synthesize as ``cdk synth`` does; ``build(app, env=..., synthesizer=...)`` makes the stack and
    returns its name. Cached by ``key`` for the session (a synth takes seconds)."""
    if key in _SYNTH_CACHE:
        return _SYNTH_CACHE[key]
    import aws_cdk as cdk

    from .cdk_helpers import FLAGS, stand_in_rayd

    outdir = _SYNTH_ROOT / re.sub(r"[^A-Za-z0-9-]", "-", key)
    app = cdk.App(outdir=str(outdir), analytics_reporting=False, context={**FLAGS, "base_artifact": stand_in_rayd()})
    name = build(app, env=cdk.Environment(account=ACCOUNT, region=REGION),
                 synthesizer=cdk.DefaultStackSynthesizer(generate_bootstrap_version_rule=False))
    app.synth()
    _SYNTH_CACHE[key] = Assembly(outdir, name)
    return _SYNTH_CACHE[key]


def fleet_stack(project: Any, stack_name: Optional[str] = None, **props: Any) -> Callable[..., str]:
    """A builder for :func:`synth`: one ``FleetStack`` (as ``app.py`` makes it)."""
    def build(app: Any, **stack_props: Any) -> str:
        from rayito_constructs import FleetStack

        name = stack_name or f"RayitoFleet-{project.name}"
        FleetStack(app, name, project=project, **props, **stack_props)
        return name
    return build


def own_stack(stack_name: str, fleets: dict[str, tuple[Any, dict[str, Any]]]) -> Callable[..., str]:
    """A builder for :func:`synth`: a user's own stack of ``AgentFleet`` constructs (``{construct id:
    (project, AgentFleet keyword arguments)}``), no outputs."""
    def build(app: Any, **stack_props: Any) -> str:
        import aws_cdk as cdk

        from rayito_constructs import AgentFleet

        stack = cdk.Stack(app, stack_name, **stack_props)
        for construct_id, (project, props) in fleets.items():
            AgentFleet(stack, construct_id, project=project, **props)
        return stack_name
    return build


def _zip(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(folder).as_posix())
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# The world


class World:
    """moto (server mode), the MicroVMs emulator, and the fakes; ``deploy`` puts a fleet in it."""

    def __init__(self, moto_endpoint: str, emulator: MicrovmsEmulator) -> None:
        self.endpoint = moto_endpoint
        self.emulator = emulator
        self.versions = ImageVersions()
        self.quotas = ServiceQuotas()
        fake_iam = self.moto("iam")
        fake_iam.meta.test_fake = True  # its reads are the fake's, not verify's (see the call recorder)
        self.iam_simulator = IamSimulator(fake_iam)
        self.microvms = emulator.client()
        self._hooks: list[Callable[[Any], None]] = []
        self.now = time.time
        self.recipe_fault: Optional[tuple[str, str]] = None
        """``(code, reason)``: the recipe writer saves nothing and answers that outcome."""
        self.functions: Optional[tuple[str, Any]] = None
        """Lambda's Invoke on loopback (``tests/lambda_invoke.py``): its URL and registry."""

    def moto(self, service: str, region: str = REGION) -> Any:
        return boto3.client(service, endpoint_url=self.endpoint, region_name=region,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def session(self, region: str = REGION, *, quotas: Optional[ServiceQuotas] = None,
                versions: Optional[ImageVersions] = None, simulator: Optional[IamSimulator] = None,
                hooks: Iterable[Callable[[Any], None]] = ()) -> boto3.Session:
        """The session verify gets: the environment's credentials and the fakes hooked in (the
        world's, or the ones given)."""
        core = botocore.session.get_session()
        # One model loader for every session of the tests: each new session would otherwise parse
        # the service models again (seconds per verify run).
        if "loader" in _SHARED:
            core.register_component("data_loader", _SHARED["loader"])
        else:
            _SHARED["loader"] = core.get_component("data_loader")
        session = boto3.Session(botocore_session=core, region_name=region)
        events = session.events
        (simulator or self.iam_simulator).register(events)
        (quotas or self.quotas).register(events)
        # The managed base image's versions stay the fake's even though the emulator lists them
        # (AVAILABLE, as measured): tests vary their status (DEPRECATED, EXPIRING, RECALLED).
        (versions or self.versions).register(events, skip=_emulated() - {"ListManagedMicrovmImageVersions"})
        for hook in [*self._hooks, *hooks]:
            hook(events)
        return session

    def on_session(self, hook: Callable[[Any], None]) -> None:
        """Hook every later session's events (fault injection)."""
        self._hooks.append(hook)

    def deploy(self, assembly: Assembly, *, stack_name: Optional[str] = None, region: str = REGION,
               template: Optional[dict[str, Any]] = None) -> str:
        """``cdk deploy`` into moto: publish the assets, create the stack, wait for it."""
        s3 = self.moto("s3", region)
        for asset in assembly.assets["files"].values():
            source = assembly.outdir / asset["source"]["path"]
            body = _zip(source) if asset["source"].get("packaging") == "zip" else source.read_bytes()
            for destination in asset["destinations"].values():
                bucket = destination["bucketName"].replace(REGION, region)
                with contextlib.suppress(Exception):
                    if region == "us-east-1":
                        s3.create_bucket(Bucket=bucket)
                    else:
                        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
                s3.put_object(Bucket=bucket, Key=destination["objectKey"], Body=body)
        name = stack_name or assembly.stack_name
        body = json.dumps(template or assembly.template)
        if region != REGION:
            body = body.replace(f"-{REGION}", f"-{region}")
        cfn = self.moto("cloudformation", region)
        cfn.create_stack(StackName=name, TemplateBody=body, Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = cfn.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
            if not status.endswith("IN_PROGRESS"):
                assert status == "CREATE_COMPLETE", status
                return name
            time.sleep(0.1)
        raise AssertionError(f"stack {name} did not finish creating")

    def outputs(self, stack: str, region: str = REGION) -> dict[str, str]:
        found = self.moto("cloudformation", region).describe_stacks(StackName=stack)["Stacks"][0]
        return {o["OutputKey"]: o["OutputValue"] for o in found.get("Outputs", [])}

    def physical(self, stack: str, logical_prefix: str, type_: str) -> str:
        resources = self.moto("cloudformation").list_stack_resources(StackName=stack)["StackResourceSummaries"]
        return next(r["PhysicalResourceId"] for r in resources
                    if r["ResourceType"] == type_ and r["LogicalResourceId"].startswith(logical_prefix))

    def function_config(self, stack: str) -> dict[str, Any]:
        return self.moto("lambda").get_function_configuration(FunctionName=self.outputs(stack)["ReconcilerFunctionName"])

    # ------------------------------------------------------------------ the reconciler, for real

    def tick(self, stack: str, *, seconds: float = 3.0, status: str = "success") -> dict[str, Any]:
        """One scheduled invocation of the real reconciler handler with the function's environment;
        its output, framed by Lambda's platform lines, goes to the function's log group."""
        from rayito_constructs._lambdas.reconciler import index

        config = self.function_config(stack)
        env = dict(config["Environment"]["Variables"])
        env.update(self._serving(env))
        group = self._log_group(stack)
        request_id = str(uuid.uuid4())

        class _Context:
            aws_request_id = request_id

            @staticmethod
            def get_remaining_time_in_millis() -> int:
                return int((seconds + 5) * 1000)

        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        out = io.StringIO()
        started = time.time()
        try:
            index._RECONCILER = None
            with contextlib.redirect_stdout(out):
                result = index.handler({"source": "schedule"}, _Context())
        finally:
            index._RECONCILER = None
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        lines = [json.dumps({"time": _iso(started), "type": "platform.start", "record": {"requestId": request_id}})]
        lines += [line for line in out.getvalue().splitlines() if line.strip()]
        lines.append(json.dumps({"time": _iso(time.time()), "type": "platform.report", "record": {
            "requestId": request_id, "status": status,
            "metrics": {"durationMs": round((time.time() - started) * 1000, 2), "billedDurationMs": 1000,
                        "memorySizeMB": 256, "maxMemoryUsedMB": 90}}}))
        self.put_log(group, lines)
        return result

    def _serving(self, env: dict[str, str]) -> dict[str, str]:
        """What a tick needs of the deploy beyond the template: the fleet's access token (moto's
        CloudFormation makes no ``AWS::SecretsManager::Secret``: it is put as the stack would
        generate it) and its server (``VirtualServer`` behind Lambda's Invoke on loopback, on the
        emulator's clock); the environment the tick adds for it."""
        from rayito._payload import generate_access_token

        from rayito_constructs.testing.serving import VirtualServer

        from .moto_server import put_secret

        extra: dict[str, str] = {}
        if env.get("ACCESS_TOKEN_SECRET"):
            secrets = self.moto("secretsmanager")
            try:
                secrets.describe_secret(SecretId=env["ACCESS_TOKEN_SECRET"])
            except secrets.exceptions.ResourceNotFoundException:
                put_secret(secrets, env["ACCESS_TOKEN_SECRET"], generate_access_token())
        if env.get("SERVER_FUNCTION") and self.functions is not None:
            from rayito_constructs._lambdas.reconciler.ledger import DynamoDBLedger

            url, registry = self.functions
            server = VirtualServer(self.emulator, DynamoDBLedger(self.moto("dynamodb"), env["LEDGER_TABLE"]))
            registry.register(env["SERVER_FUNCTION"], server.ask)
            extra["AWS_ENDPOINT_URL_LAMBDA"] = url
        return extra

    def _log_group(self, stack: str) -> str:
        config = self.function_config(stack)
        group = (config.get("LoggingConfig") or {}).get("LogGroup")
        return group or self.physical(stack, "FleetReconcilerLogs", "AWS::Logs::LogGroup")

    def put_log(self, group: str, lines: list[str], at: Optional[float] = None) -> None:
        logs = self.moto("logs")
        stream = f"{time.strftime('%Y/%m/%d')}/[$LATEST]{uuid.uuid4().hex}"
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_group(logGroupName=group)
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        when = int((at if at is not None else time.time()) * 1000)
        logs.put_log_events(logGroupName=group, logStreamName=stream,
                            logEvents=[{"timestamp": when + i, "message": line} for i, line in enumerate(lines)])

    def converge(self, stack: str, *, ticks: int = 8) -> None:
        """Tick until the fleet has min_vms running and warm_vms parked (bounded)."""
        env = self.function_config(stack)["Environment"]["Variables"]
        want_base, want_warm = int(env["MIN_VMS"]), int(env.get("WARM_VMS", "0"))
        for _ in range(ticks):
            self.tick(stack)
            states = [vm["state"] for vm in self.emulator.microvms()]
            if states.count("SUSPENDED") >= want_warm and states.count("RUNNING") >= want_base:
                return
            time.sleep(0.3)
        raise AssertionError(f"the fleet did not converge: {states}")

    # ------------------------------------------------------------------ verify

    def verify(self, target: str, *, session: Optional[boto3.Session] = None, **options: Any) -> Any:
        kwargs = {k: options.pop(k) for k in ("probe", "clock", "sleep", "on_note", "attempts") if k in options}
        kwargs.setdefault("attempts", 2)
        return verify(Options(target, **options), session=session or self.session(options.get("region") or REGION),
                      **kwargs)


def statuses(report: Any) -> dict[str, str]:
    """check -> status; repeated checks (one per egress target) keep the worst."""
    order = {"OK": 0, "WARN": 1, "FAIL": 2}
    out: dict[str, str] = {}
    for f in report.findings:
        if order[f.status.value] >= order.get(out.get(f.check, "OK"), 0):
            out[f.check] = f.status.value
    return out


def finding(report: Any, check: str) -> Any:
    return next(f for f in report.findings if f.check == check)


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z"


def _emulated() -> frozenset:
    from rayito_constructs.testing import microvms

    return microvms.IMPLEMENTED


@contextlib.contextmanager
def world(monkeypatch: Any, **emulator_options: Any) -> Iterator[World]:
    """moto in server mode and the emulator, with the SDK's endpoints pointed at them."""
    from .moto_server import moto_server, untraced_requests

    install_providers()
    # Short timings, every read current, no slow first launches: the tests are about verify, and a
    # fleet that converges in a second or two.
    options = {"pending_seconds": 0.2, "suspending_seconds": 0.1, "terminating_seconds": 0.1,
               "image_build_seconds": 0.0, "consistency_seconds": 0.0, "fresh_launches": 0, **emulator_options}
    from .lambda_invoke import lambda_functions

    with moto_server() as endpoint, MicrovmsEmulator(**options) as emulator, lambda_functions() as functions:
        untraced_requests(emulator)  # coverage skips its request threads (tests/moto_server.py)
        # moto's servers in one process share their backends: start from an empty account.
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).read()
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA_MICROVMS", emulator.endpoint_url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
            monkeypatch.delenv(key, raising=False)
        current = World(endpoint, emulator)
        current.functions = functions
        _CURRENT["world"] = current
        try:
            yield current
        finally:
            _CURRENT.pop("world", None)


def cleanup() -> None:
    shutil.rmtree(_SYNTH_ROOT, ignore_errors=True)

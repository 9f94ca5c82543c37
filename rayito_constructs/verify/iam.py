"""IAM: each managed policy (SimulateCustomPolicy with its deployed document) and the reconciler's
role (SimulatePrincipalPolicy, so its permissions boundary counts) asked what the product page and
the measured service say it must be able to do, and what it must never do.

Must allow / must deny, and why (``shared/seeds/001_*`` "Who can write it";
``rayito-ground-truth.md`` section 1; ``docs/iam.md``):

* lifecycle actions on the fleet's own image, ``lambda:ListMicrovms`` on ``*``, the AWS-managed
  connectors RunMicrovm passes even when none is named (``HTTP_INGRESS``, ``INTERNET_EGRESS``), the
  execution role with ``iam:PassedToService = lambda.amazonaws.com``;
* reading and deleting the recipe (launcher), writing it (caller, publisher): never the launcher;
* nothing on another fleet's image (measured: RunMicrovm is authorized on the unversioned image
  ARN), probed with ``<name>-other`` (a prefix match would allow it) and an unrelated name;
* the publisher: CreateMicrovmImage on ``*`` (measured: it is authorized on ``*``), update and
  versions on the image, PassNetworkConnector ``INTERNET_EGRESS`` for create/update, never running VMs;
* per path of the product (``Probe.path``, the paths tests/test_product_iam.py records and
  docs/iam.md tabulates): the launcher reads the fleet's access token and never another fleet's,
  the publisher uploads under the product's artifact keys, lists VMs for prune
  and reads its base image's versions (the bucket and base image the fleet was deployed with), the
  launcher reads the gateways' and ``[secret_env]`` secrets of the project its recipe holds and
  writes and reads the metadata index, the caller describes the gateway secrets it deploys with
  and renews the bedrock gateways' keys.

The simulator answers ``implicitDeny`` for ``lambda:PassNetworkConnector`` even with administrator
permissions (Rayito's ``doctor``, ``docs/site/docs/operacion/iam.md``): such a deny is reported as
the known false deny (WARN) when the policy does hold an Allow statement for it, as a FAIL otherwise.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from .aws import AwsError, unable
from .context import Context, recipe_properties
from .policy import granting_statement
from .report import Finding, fail, ok, warn

LIFECYCLE = ("lambda:RunMicrovm", "lambda:GetMicrovm", "lambda:SuspendMicrovm", "lambda:ResumeMicrovm",
             "lambda:TerminateMicrovm", "lambda:CreateMicrovmAuthToken")
FALSE_DENY_ACTIONS = ("lambda:PassNetworkConnector",)
MANAGED_CONNECTORS = ("HTTP_INGRESS", "INTERNET_EGRESS")
LAMBDA_SERVICE = "lambda.amazonaws.com"

Context_ = tuple[tuple[str, tuple[str, ...], str], ...]


@dataclass(frozen=True)
class Probe:
    """One question for the simulator: ``action`` on ``resource`` must be allowed (or denied)."""

    action: str
    resource: str
    must_allow: bool
    why: str
    context: Context_ = ()
    path: str = ""


@dataclass(frozen=True)
class Answer:
    probe: Probe
    decision: str
    matched: tuple[str, ...] = ()
    false_deny: Optional[str] = None  # the Sid that does allow it, when the deny is the known false one

    @property
    def passed(self) -> bool:
        return (self.decision == "allowed") == self.probe.must_allow

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.probe.action, "resource": self.probe.resource, "path": self.probe.path,
                "expected": "allowed" if self.probe.must_allow else "denied", "decision": self.decision,
                "why": self.probe.why, "matched": list(self.matched), "known_false_deny_of": self.false_deny}


@dataclass(frozen=True)
class Refs:
    """The ARNs the probes are about."""

    fleet: str
    image: str
    other_images: tuple[str, ...]
    recipe: str
    other_recipe: str
    connectors: tuple[str, ...]
    execution_role: Optional[str] = None
    build_role: Optional[str] = None
    recipe_key: Optional[str] = None
    ledger: Optional[str] = None
    budget: Optional[str] = None
    dead_letters: Optional[str] = None
    region: str = ""
    access_token: str = ""
    other_access_token: str = ""
    artifact_bucket: str = ""
    base_image: str = ""
    index: Optional[str] = None  # the metadata index's table
    gateway_secrets: tuple[str, ...] = ()  # the secrets the project's gateways read (from the recipe)
    renewed_secrets: tuple[str, ...] = ()  # ... the bedrock ones --renew-gateway-keys writes
    secret_env: tuple[str, ...] = ()  # [secret_env]'s secrets


def _secret(ctx: Context, secret_id: str) -> str:
    """A secret's ARN as a call names it (an id given as an ARN is one; a name gets the six random
    characters a secret's ARN ends in, which policies name ``-??????``)."""
    return secret_id if secret_id.startswith("arn:") else ctx.arn("secretsmanager", f"secret:{secret_id}-AbCdEf")


def _session_secrets(ctx: Context) -> Any:
    """The secrets the fleet's sessions read, from the project its recipe holds (the product's
    rules, :func:`~rayito_constructs.permissions.session_secrets`); none when it has no recipe."""
    from types import SimpleNamespace

    from ..model.secrets import SessionSecrets, session_secrets
    from ..model.product import decode

    try:
        read = ctx.recipe()
        if read is None or not read.value or read.doc is None:
            return SessionSecrets()
        _, project = decode(read.value)
        return session_secrets(SimpleNamespace(product=project))
    except (AwsError, ValueError):
        return SessionSecrets()


def _deployed_resources(document: Optional[dict[str, Any]], sid: str) -> list[str]:
    """The resources of the statement ``sid`` of a deployed policy document."""
    for statement in (document or {}).get("Statement", []) or []:
        if statement.get("Sid") == sid:
            resources = statement.get("Resource") or []
            return [resources] if isinstance(resources, str) else [str(r) for r in resources]
    return []


def with_deployed_places(r: Refs, document: Optional[dict[str, Any]]) -> Refs:
    """``r`` with the artifact bucket and base image the fleet was deployed with (a fleet may name
    its own: ``artifact_bucket=``, ``[image] base``), as its publisher policy's statements say;
    ``rayito setup``'s defaults otherwise."""
    import dataclasses

    uploads = [a.split("/rayito/", 1)[0] for a in _deployed_resources(document, "UploadArtifacts")
               if a.startswith("arn:") and "/rayito/" in a]
    bases = [a for a in _deployed_resources(document, "BaseImage") if ":microvm-image:" in a and not a.endswith(":*")]
    return dataclasses.replace(r, artifact_bucket=uploads[0] if uploads else r.artifact_bucket,
                               base_image=bases[0] if bases else r.base_image)


def refs(ctx: Context) -> Optional[Refs]:
    image = ctx.image_arn()
    fleet = ctx.fleet_name
    if not image or not fleet:
        return None
    base, image_name = image.rsplit(":microvm-image:", 1) if ":microvm-image:" in image else (image, fleet)
    image_name = image_name.split(":", 1)[0] or fleet
    env = ctx.reconciler_env()
    build_role = None
    try:
        versions = ctx.image_versions()
        build_role = next((v.get("buildRoleArn") for v in reversed(versions) if v.get("buildRoleArn")), None)
    except AwsError:
        pass
    queue_url = env.get("DEAD_LETTER_QUEUE_URL") or ctx.fleet.dead_letter_queue_url
    secrets = _session_secrets(ctx)
    index = ctx.fleet.metadata_table
    return Refs(
        fleet=fleet,
        image=image,
        # ``<image>-other``: a policy on ``<image>*`` (a prefix) would allow it.
        other_images=(f"{base}:microvm-image:{image_name}-other", f"{base}:microvm-image:rayito-verify-probe"),
        recipe=ctx.arn("ssm", f"parameter/rayito/agents/{fleet}/recipe"),
        other_recipe=ctx.arn("ssm", f"parameter/rayito/agents/{fleet}-other/recipe"),
        connectors=tuple(f"arn:{ctx.partition}:lambda:{ctx.region}:aws:network-connector:aws-network-connector:{c}"
                         for c in MANAGED_CONNECTORS),
        execution_role=ctx.execution_role_arn(),
        build_role=build_role,
        recipe_key=recipe_key_arn(ctx),
        ledger=ctx.arn("dynamodb", f"table/{env['LEDGER_TABLE']}") if env.get("LEDGER_TABLE") else None,
        budget=ctx.arn("dynamodb", f"table/{env['BUDGET_TABLE']}") if env.get("BUDGET_TABLE") else None,
        dead_letters=ctx.arn("sqs", queue_url.rstrip("/").rsplit("/", 1)[-1]) if queue_url else None,
        region=ctx.region,
        # A secret's ARN ends in six random characters: these stand for them (the policy names -??????).
        access_token=ctx.arn("secretsmanager", f"secret:rayito/agents/{fleet}/access-token-AbCdEf"),
        other_access_token=ctx.arn("secretsmanager", f"secret:rayito/agents/{fleet}-other/access-token-AbCdEf"),
        artifact_bucket=f"arn:{ctx.partition}:s3:::rayito-artifacts-{ctx.account}-{ctx.region}",
        base_image=f"{base}:microvm-image:rayito-base-caps",
        index=ctx.arn("dynamodb", f"table/{index}") if index else None,
        gateway_secrets=tuple(_secret(ctx, g) for g in secrets.gateways),
        renewed_secrets=tuple(_secret(ctx, g) for g in secrets.renewed),
        secret_env=tuple(_secret(ctx, g) for g in secrets.secret_env),
    )


def recipe_key_arn(ctx: Context) -> Optional[str]:
    """The customer key of the recipe, when the stack gives one (the recipe resource's KeyId)."""
    try:
        props = recipe_properties(ctx)
    except AwsError:
        return None
    key = (props or {}).get("KeyId")
    return key if isinstance(key, str) and key.startswith("arn:") else None


def _pass_role(role: str, why: str, must_allow: bool = True) -> Probe:
    return Probe("iam:PassRole", role, must_allow, why, (("iam:PassedToService", (LAMBDA_SERVICE,), "string"),))


def _microvms(r: Refs, actions: Iterable[str] = LIFECYCLE, *, execution_role: bool = True) -> list[Probe]:
    probes = [Probe("lambda:ListMicrovms", "*", True, "find the fleet's members (acts on no resource)")]
    probes += [Probe(a, r.image, True, "the MicroVM lifecycle on the fleet's image") for a in actions]
    probes += [Probe("lambda:PassNetworkConnector", c, True, "RunMicrovm passes the AWS-managed connectors "
                     "even when none is named") for c in r.connectors]
    if r.execution_role and execution_role:
        probes.append(_pass_role(r.execution_role, "RunMicrovm's executionRoleArn"))
    probes += [Probe(a, other, False, "lifecycle calls on another fleet's image")
               for other in r.other_images for a in LIFECYCLE]
    return probes


def _key(r: Refs, action: str) -> list[Probe]:
    if not r.recipe_key:
        return []
    return [Probe(action, r.recipe_key, True, "the recipe's customer key, through SSM",
                  (("kms:ViaService", (f"ssm.{r.region}.amazonaws.com",), "string"),))]


def _on(path: str, probes: list[Probe]) -> list[Probe]:
    return [Probe(p.action, p.resource, p.must_allow, p.why, p.context, path) for p in probes]


def launcher_probes(r: Refs) -> list[Probe]:
    """The launcher's paths: connect/status/invoke/stream/stop (and a warm slot, a session with
    the index: the same actions), the secrets a session reads; never a write of the recipe or an
    image, never another fleet's secrets."""
    return [
        *_on("connect, status, invoke, stream, stop", [
            *_microvms(r, execution_role=False),
            Probe("ssm:GetParameter", r.recipe, True, "read the recipe to start VMs like the deployed ones"),
            Probe("ssm:DeleteParameter", r.recipe, True, "delete the recipe on stop"),
            *_key(r, "kms:Decrypt"),
            Probe("secretsmanager:GetSecretValue", r.access_token, True, "the fleet's access token (RAYITO_ACCESS_TOKEN)"),
        ]),
        *_on("a session with gateways and secret_env", [
            *[Probe("secretsmanager:GetSecretValue", g, True, "a gateway's secret, read once a VM is ready")
              for g in r.gateway_secrets],
            *[Probe("secretsmanager:GetSecretValue", g, True, "a [secret_env] secret, read into the session")
              for g in r.secret_env],
        ]),
        *_on("the session index", [
            Probe("dynamodb:PutItem", r.index, True, "write a session's row (RayitoIndexWriter)"),
            Probe("dynamodb:BatchGetItem", r.index, True, "read the members' rows (RayitoIndexReader)"),
        ] if r.index else []),
        *_on("never", [
            Probe("ssm:PutParameter", r.recipe, False, "writing the recipe amounts to deploy rights: never the launcher"),
            Probe("ssm:PutParameter", r.other_recipe, False, "another fleet's recipe"),
            Probe("lambda:CreateMicrovmImage", "*", False, "a launcher never publishes an image"),
            Probe("lambda:UpdateMicrovmImage", r.image, False, "a launcher never publishes an image"),
            Probe("secretsmanager:GetSecretValue", r.other_access_token, False, "another fleet's access token"),
        ]),
    ]


def caller_probes(r: Refs) -> list[Probe]:
    """The launcher's paths and the publisher's, and rayito agent deploy's recipe."""
    launcher = launcher_probes(r)
    return [
        *[p for p in launcher if p.must_allow],
        # The caller drives VMs too: nothing on another fleet's image either.
        *[p for p in launcher if not p.must_allow and p.action in LIFECYCLE],
        *[p for p in publisher_probes(r) if p.must_allow],
        *_on("agent deploy", [Probe("ssm:PutParameter", r.recipe, True, "the deployer saves the recipe"),
                              *_key(r, "kms:Encrypt"),
                              *[Probe("secretsmanager:DescribeSecret", g, True, "deploy checks each gateway's secret")
                                for g in r.gateway_secrets]]),
        *_on("agent deploy --renew-gateway-keys", [
            Probe(a, g, True, "the bedrock gateways' keys, renewed") for g in r.renewed_secrets
            for a in ("secretsmanager:DescribeSecret", "secretsmanager:PutSecretValue")]),
        *_on("never", [Probe("ssm:PutParameter", r.other_recipe, False, "another fleet's recipe"),
                       Probe("secretsmanager:GetSecretValue", r.other_access_token, False, "another fleet's access token")]),
    ]


def publisher_probes(r: Refs) -> list[Probe]:
    """rayito image publish, rayito agent build, rayito image prune."""
    probes = _on("image publish", [
        Probe("lambda:CreateMicrovmImage", "*", True, "CreateMicrovmImage is authorized on * (measured)"),
        *[Probe(a, r.image, True, "publish and inspect the fleet's image and its versions") for a in (
            "lambda:UpdateMicrovmImage", "lambda:GetMicrovmImage", "lambda:ListMicrovmImageVersions",
            "lambda:GetMicrovmImageVersion", "lambda:ListMicrovmImageBuilds", "lambda:GetMicrovmImageBuild")],
        Probe("lambda:PassNetworkConnector", r.connectors[-1], True,
              "create and update pass INTERNET_EGRESS even when none is named (measured)"),
        Probe("s3:PutObject", f"{r.artifact_bucket}/rayito/images/rayd-probe.zip", True, "upload the image's zip"),
    ])
    probes += _on("agent build", [
        Probe("s3:PutObject", f"{r.artifact_bucket}/rayito/templates/probe.zip", True, "upload the agent's artifact"),
        *[Probe(a, r.base_image, True, "read the versions of the base image agent build builds on")
          for a in ("lambda:ListMicrovmImageVersions", "lambda:GetMicrovmImageVersion")],
    ])
    probes += _on("image prune", [
        Probe("lambda:ListMicrovms", "*", True, "keep the versions VMs run"),
        Probe("lambda:DeleteMicrovmImageVersion", r.image, True, "delete old versions"),
    ])
    probes += _on("never", [
        *[Probe(a, r.image, False, "a publisher cannot run sandboxes") for a in ("lambda:RunMicrovm", "lambda:TerminateMicrovm")],
        *[Probe(a, other, False, "another fleet's image") for other in r.other_images
          for a in ("lambda:UpdateMicrovmImage", "lambda:DeleteMicrovmImageVersion")],
        Probe("lambda:DeleteMicrovmImage", r.image, False, "no path deletes the image"),
        Probe("ssm:PutParameter", r.recipe, False, "no publisher path writes the recipe"),
    ])
    if r.build_role:
        probes += _on("image publish", [_pass_role(r.build_role, "CreateMicrovmImage's buildRoleArn")])
    return probes


def reconciler_probes(r: Refs) -> list[Probe]:
    probes = _microvms(r, ("lambda:RunMicrovm", "lambda:GetMicrovm", "lambda:SuspendMicrovm", "lambda:TerminateMicrovm"))
    mine = (("dynamodb:LeadingKeys", (r.fleet,), "stringList"),)
    other = (("dynamodb:LeadingKeys", (f"{r.fleet}-other",), "stringList"),)
    if r.ledger:
        probes += [Probe(a, r.ledger, True, "the fleet's own ledger items", mine)
                   for a in ("dynamodb:Query", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")]
        probes.append(Probe("dynamodb:PutItem", r.ledger, False, "another fleet's ledger items", other))
    if r.budget:
        probes += [Probe(a, r.budget, True, "the shared control-plane budget") for a in ("dynamodb:UpdateItem", "dynamodb:GetItem")]
    if r.dead_letters:
        probes.append(Probe("sqs:SendMessage", r.dead_letters, True, "dead-lettered slots"))
    probes.append(Probe("ssm:PutParameter", r.recipe, False, "the reconciler never writes the recipe"))
    return probes


def simulate(ctx: Context, probes: list[Probe], *, documents: Optional[list[Any]] = None,
             principal: Optional[str] = None) -> list[Answer]:
    """Ask the simulator; one paginated call per (resource, context). Raises :class:`AwsError`."""
    groups: dict[tuple[str, Context_], list[Probe]] = {}
    for probe in probes:
        groups.setdefault((probe.resource, probe.context), []).append(probe)
    answers: list[Answer] = []
    for (resource, context), group in groups.items():
        params: dict[str, Any] = {"ActionNames": sorted({p.action for p in group}), "ResourceArns": [resource]}
        if context:
            params["ContextEntries"] = [{"ContextKeyName": k, "ContextKeyValues": list(v), "ContextKeyType": t}
                                        for k, v, t in context]
        if principal:
            pages = ctx.clients.pages("iam", "simulate_principal_policy", PolicySourceArn=principal, **params)
        else:
            pages = ctx.clients.pages("iam", "simulate_custom_policy",
                                      PolicyInputList=[json.dumps(d) for d in documents or []], **params)
        decisions: dict[str, tuple[str, tuple[str, ...]]] = {}
        for page in pages:
            for result in page.get("EvaluationResults", []):
                matched = tuple(str(m.get("SourcePolicyId") or m.get("SourcePolicyType") or "")
                                for m in result.get("MatchedStatements", []) or [])
                decisions[result["EvalActionName"].lower()] = (result.get("EvalDecision", "implicitDeny"), matched)
        for probe in group:
            decision, matched = decisions.get(probe.action.lower(), ("implicitDeny", ()))
            false_deny = None
            if probe.must_allow and decision == "implicitDeny" and probe.action in FALSE_DENY_ACTIONS:
                false_deny = granting_statement(documents or [], probe.action, probe.resource)
            answers.append(Answer(probe, decision, matched, false_deny))
    return answers


def role_documents(ctx: Context, role_arn: str) -> list[Any]:
    """The policy documents of a role (attached and inline), for the false-deny test. Raises AwsError."""
    name = role_arn.rsplit("/", 1)[-1]
    documents = []
    for page in ctx.clients.pages("iam", "list_attached_role_policies", RoleName=name):
        for attached in page.get("AttachedPolicies", []):
            documents.append(ctx.policy_document(attached["PolicyArn"]))
    for page in ctx.clients.pages("iam", "list_role_policies", RoleName=name):
        for policy_name in page.get("PolicyNames", []):
            document = ctx.clients.call("iam", "get_role_policy", RoleName=name, PolicyName=policy_name)["PolicyDocument"]
            if isinstance(document, str):
                from urllib.parse import unquote

                document = json.loads(unquote(document))
            documents.append(document)
    return documents


def judge(check: str, who: str, answers: list[Answer], fix_hint: str) -> Finding:
    """One finding for one principal's answers."""
    data = {"principal": who, "answers": [a.to_dict() for a in answers]}
    real = [a for a in answers if not a.passed and not a.false_deny]
    false_denies = [a for a in answers if not a.passed and a.false_deny]
    allowed = sum(1 for a in answers if a.probe.must_allow and a.passed)
    denied = sum(1 for a in answers if not a.probe.must_allow and a.passed)
    counts = f"{allowed} allowed and {denied} denied as required"
    if real:
        groups: dict[tuple[str, bool], list[Answer]] = {}
        for a in real:
            groups.setdefault((a.probe.why, a.probe.must_allow), []).append(a)
        parts = []
        for (why, must_allow), group in groups.items():
            actions = ", ".join(dict.fromkeys(_action(a.probe.action) for a in group))
            resources = ", ".join(dict.fromkeys(_resource(a.probe.resource) for a in group))
            verb = "denied" if must_allow else "ALLOWED"
            paths = ", ".join(dict.fromkeys(a.probe.path for a in group if a.probe.path and a.probe.path != "never"))
            parts.append(f"{actions} on {resources} {verb} ({why}{'; path: ' + paths if paths else ''})")
        return fail(check, f"{who}: {'; '.join(parts)}", fix_hint, **data)
    if false_denies:
        sids = ", ".join(sorted({a.false_deny or "" for a in false_denies}))
        return warn(check, f"{who}: {counts}; the simulator says implicitDeny for {false_denies[0].probe.action} "
                    f"although statement {sids} allows it (its known false deny, seen with administrator "
                    "permissions too)", "nothing to fix: only a real call proves it (verify --launch makes a RunMicrovm "
                    "with the launcher's permissions)", **data)
    return ok(check, f"{who}: {counts}", **data)


def _action(action: str) -> str:
    return action.split(":", 1)[-1] if action.startswith("lambda:") else action


def _resource(arn: str) -> str:
    """The part of an ARN that names the resource (``microvm-image:x``, ``parameter/...``)."""
    if arn == "*" or not arn.startswith("arn:"):
        return arn
    parts = arn.split(":", 5)
    return parts[5] if len(parts) == 6 else arn


POLICIES = (
    ("SandboxLauncherPolicy", launcher_probes),
    ("CallerPolicy", caller_probes),
    ("ImagePublisherPolicy", publisher_probes),
)


def check(ctx: Context) -> list[Finding]:
    r = refs(ctx)
    if r is None:
        return [fail("iam", "the fleet's name or image is unknown: nothing to simulate",
                     "deploy the fleet's stack completely")]
    findings = []
    publisher = ctx.fleet.policy_arn("ImagePublisherPolicy")
    with contextlib.suppress(AwsError):  # the publisher's own check says why it cannot be read
        r = with_deployed_places(r, ctx.policy_document(publisher) if publisher else None)
    for kind, make in POLICIES:
        check_id = f"iam.{kind}"
        arn = ctx.fleet.policy_arn(kind)
        if not arn:
            findings.append(fail(check_id, f"{kind} is not deployed", "deploy the fleet's stack completely"))
            continue
        try:
            document = ctx.policy_document(arn)
            answers = simulate(ctx, make(r), documents=[document])
        except AwsError as error:
            findings.append(unable(check_id, error, f"simulate {kind}"))
            continue
        findings.append(judge(check_id, kind, answers,
                              "deploy the stack again with this library (was the policy changed by hand?); "
                              "docs/iam.md says what each statement must be"))
    findings.append(_reconciler_role(ctx, r))
    return findings


def _reconciler_role(ctx: Context, r: Refs) -> Finding:
    if not ctx.fleet.reconciler_function:
        return warn("iam.reconciler", "no reconciler deployed: no role to simulate",
                    "nothing to do unless the fleet should have a reconciler (reconciler=True)")
    try:
        config = ctx.reconciler_config() or {}
        role = config.get("Role")
        answers = simulate(ctx, reconciler_probes(r), principal=role)
    except AwsError as error:
        return unable("iam.reconciler", error, "simulate the reconciler's role")
    if any(not a.passed for a in answers):
        try:
            documents = role_documents(ctx, role)
            answers = [Answer(a.probe, a.decision, a.matched, granting_statement(documents, a.probe.action, a.probe.resource))
                       if a.false_deny is None and a.probe.must_allow and a.decision == "implicitDeny"
                       and a.probe.action in FALSE_DENY_ACTIONS else a for a in answers]
        except AwsError:
            pass  # without the documents a PassNetworkConnector deny stays a FAIL: the safe side
    return judge("iam.reconciler", f"reconciler role {role.rsplit('/', 1)[-1]}", answers,
                 "deploy the stack again with this library (a permissions boundary or an SCP may also deny it)")

#!/usr/bin/env python3
"""Synthesize the fleet of one agent folder.

    npx cdk synth                                   # examples/mi-agente
    npx cdk synth -c project=path/to/agent          # another Rayito agent folder
    npx cdk synth -c min_vms=2 -c max_vms=4         # rayito agent deploy's flags, as `plan` takes them
    npx cdk synth -c max_sessions=4 -c warm=2 -c memory=8192 -c save_recipe=false
    npx cdk synth -c image_arn=arn:aws:lambda:...   # a MicroVM image published elsewhere
    npx cdk synth -c metadata_index=true            # with the session index
    npx cdk synth -c reconciler=false               # no fleet kept by the stack (default: kept when a recipe is saved)
    npx cdk synth -c env.URL=https://a,b            # one env variable per key (or env=A=1,B=2, or JSON)
    npx cdk synth -c egress.default_rate=120/minute -c egress.default_burst=10
    npx cdk synth -c 'egress.budgets=[{"target": "https://api.example.com", "rate": "60/minute", "burst": 5}]'
                                                    # [egress] of rayito-constructs.toml (budgets: JSON, replaces the file's)
    npx cdk synth -c metrics=true -c alarm_actions=arn:aws:sns:us-east-1:123456789012:ops
                                                    # custom metrics, alarms, a dashboard (docs/operations.md)
    npx cdk synth -c log_retention=30               # days the library's function logs are kept
    npx cdk synth -c saved_queries=false            # no saved Logs Insights queries
    npx cdk synth -c keep_image_versions=10         # image versions kept (none: never prune; docs/image.md)
    npx cdk synth -c retain_vms_on_delete=true      # cdk destroy leaves the VMs running (docs/teardown.md)
    npx cdk synth -c base_artifact=rayito-image.zip -c base_artifact_sha256=HEX
                                                    # build the product's agent image over that rayd zip
    npx cdk synth -c base_image=rayito-base-caps    # ... over the base published in the account (composed at deploy)
    npx cdk synth -c build_image=false              # as rayito agent deploy --no-build (docs/image.md)
    CDK_VALIDATION=true npx cdk synth               # also run the CDK's built-in CloudFormation validation

Every flag of ``rayito agent deploy`` that ``rayito-constructs plan`` takes is accepted as context
under its name with ``_`` (``min_vms``, ``warm``, ``max_sessions``, ``memory``, ``idle``, ``env``,
``save_recipe=false``...), over the folder's ``rayito-agent.toml`` as the flags are; the stack's
switches override ``[stack]`` of ``rayito-constructs.toml``, and ``egress.default_rate``,
``egress.default_burst`` and ``egress.budgets`` (a JSON list of tables) its ``[egress]``, checked
as the file's keys are. An unknown key is an error that names
the nearest known one. The stack is
``RayitoFleet-<name>`` (made a valid stack name: ``my_agent`` gives ``RayitoFleet-my-agent-<hash>``,
as ``plan`` shows). A mistake prints one line per problem, no traceback, and exits with status 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Optional

# jsii starts Node.js when aws_cdk is imported and prints a banner on Node 20 (end of life since
# 2026-04-30; this project is tested on it): silenced for `npx cdk synth` outside make too. Only
# Node 20's banner: the variable lists the major versions to keep quiet.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

DEFAULT_PROJECT = "examples/mi-agente"
EXIT_INVALID = 2


def builtin_validation(environ: Mapping[str, str]) -> bool:
    """Whether the CDK's built-in CloudFormation validation runs: only when ``CDK_VALIDATION=true``.

    aws-cdk-lib runs cfn-lint, compiled to WebAssembly, over every template of every synth unless
    told otherwise; here it costs about 5 of a synth's 8 CPU seconds (docs/performance.md). The
    templates this app can write are the library's, and the suite checks them with cfn-lint and
    with this very validation, its errors as errors (tests/test_cdk_validation.py), so it is off by
    default here; an app of your own that imports the constructs keeps the CDK's default."""
    return environ.get("CDK_VALIDATION", "").strip().lower() == "true"


def new_app() -> "object":
    """The app ``npx cdk synth`` runs: the CDK's built-in validation as :func:`builtin_validation` says."""
    import aws_cdk as cdk

    return cdk.App(builtin_cloud_formation_validation=builtin_validation(os.environ))


def main(app: "Optional[object]" = None) -> int:
    """Synthesize; returns the exit status. ``app``: a ``cdk.App`` (tests give one with context)."""
    import aws_cdk as cdk
    from jsii.errors import JSIIError

    from rayito_constructs import AgentProject, FleetStack, Problem, ProjectError
    from rayito_constructs.monitoring import retention_from_days
    from rayito_constructs.model.overrides import name_what_was_typed, read_context

    app = app or new_app()
    options: dict = {}
    typed: dict = {}  # where each option was given: "-c " (context) or "rayito-constructs.toml: stack."
    try:
        overrides, options, problems = read_context(app.node.get_all_context())
        folder = options.get("project", DEFAULT_PROJECT)
        fleet_file = fleet_file_of(folder, options.pop("egress", None), problems)
        try:
            project = AgentProject.from_flags(folder, fleet_file=fleet_file, flags=overrides)
        except ProjectError as exc:
            for problem in name_what_was_typed(exc.problems, set(overrides), context=True):
                if problem.key == "folder" and "project" in options:
                    problem = Problem("project", f"-c project: {problem.message.split(': ', 1)[1]}")
                elif problem.key == "folder" and not Path(folder).is_dir():  # the example, from elsewhere
                    problem = Problem("project", f"-c project: not given, and the example {folder!r} is not a folder "
                                                 "here: give -c project=<your agent folder>")
                problems.append(problem)
        if problems:
            raise ProjectError(problems)
        options = merged_options(stack_options(project), options, folder, typed)
        FleetStack(
            app,
            project.stack_name,
            project=project,
            image_arn=options.get("image_arn"),
            rayd=rayd_of(options),
            base_image_version=options.get("base_image_version") or "1",
            build_image=options.get("build_image", True),
            metadata_index=options.get("metadata_index", False),
            keep_recipe=options.get("keep_recipe", False),
            reconciler=options.get("reconciler"),
            scope_microvm_actions_to_image=options.get("scope_microvm_actions_to_image", True),
            metrics=options.get("metrics", False),
            dashboard=options.get("dashboard"),
            saved_queries=options.get("saved_queries", True),
            retain_vms_on_delete=options.get("retain_vms_on_delete", False),
            keep_image_versions=options.get("keep_image_versions", 5),
            alarm_actions=list(options.get("alarm_actions", ())) or None,
            **({"log_retention": retention_from_days(options["log_retention"])} if "log_retention" in options else {}),
            env=cdk.Environment(
                account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION")
            ),
        )
        app.synth()
    except ProjectError as exc:
        for problem in exc.problems:
            print(problem.message, file=sys.stderr)
        return EXIT_INVALID
    except (ValueError, JSIIError) as exc:
        # A construct refusing its input (a bad image_arn, a name held twice...): its first line.
        lines = [line for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        given = next((key for key in options if lines[0].startswith(f"{key}: ")), None)
        print(f"{typed.get(given, '-c ')}{lines[0]}" if given else lines[0], file=sys.stderr)
        return EXIT_INVALID
    return 0


def merged_options(from_file: dict, context: dict, folder: str, typed: dict) -> dict:
    """The switches of ``app.py``: the folder's ``[stack]`` with the context over it, key by key;
    ``typed`` is filled with where each was given. ``-c base_artifact`` or ``-c base_image``
    replaces the file's rayd keys together (they name one thing); the file's relative
    ``base_artifact`` is the folder's. Rules across keys from both places are checked here."""
    from pathlib import Path

    from rayito_constructs import Problem, ProjectError
    from rayito_constructs.model.fleet_file import FLEET_FILE

    if {"base_artifact", "base_image"} & set(context):  # the context names rayd: the file's goes
        from_file = {k: v for k, v in from_file.items() if not k.startswith(("base_artifact", "base_image"))
                     or k == "base_image_version"}
    if from_file.get("base_artifact") and not Path(from_file["base_artifact"]).is_absolute():
        from_file = {**from_file, "base_artifact": str(Path(folder) / from_file["base_artifact"])}
    typed.update({**dict.fromkeys(from_file, f"{FLEET_FILE}: stack."), **dict.fromkeys(context, "-c ")})
    options = {**from_file, **context}
    problems = []
    if "base_artifact_sha256" in options and "base_artifact" not in options:
        problems.append(Problem("base_artifact_sha256", f"{typed['base_artifact_sha256']}base_artifact_sha256: give "
                                                        "base_artifact (the zip it is the sha256 of) with it"))
    rayd = next((key for key in ("base_artifact", "base_image") if options.get(key)), None)
    if options.get("image_arn") and rayd and options.get("build_image", True):
        problems.append(Problem("image_arn", f"{typed['image_arn']}image_arn, {typed[rayd]}{rayd}: give one of them "
                                             "(an image published elsewhere, or the one the stack builds)"))
    if problems:
        raise ProjectError(problems)
    return options


def fleet_file_of(folder: str, egress: "Optional[dict]", problems: list) -> "object":
    """The folder's ``rayito-constructs.toml`` with the ``-c egress.<key>`` context over its
    ``[egress]``; None (the folder's file, read by ``AgentProject.load``) without such context, or
    when the file itself is wrong (``AgentProject.load`` reports that). Problems are appended."""
    from pathlib import Path

    from rayito_constructs import ProjectError
    from rayito_constructs.model.fleet_file import FleetFile

    if not egress:
        return None
    try:
        settings = FleetFile.read(Path(folder))
    except ProjectError:
        return None
    try:
        return settings.with_egress(egress)
    except ProjectError as exc:
        problems.extend(exc.problems)
        return None


def rayd_of(options: dict) -> "object":
    """``-c base_artifact=PATH [-c base_artifact_sha256=HEX]`` (or ``[stack]``): the product's
    release zip, checked by the product's ``MicrovmImageArtifact.from_file``; ``-c base_image=NAME``:
    the base published in the account, composed at deploy; None without either."""
    from rayito_constructs.agent_image import rayd_of as rayd_from_switches

    return rayd_from_switches(options.get("base_artifact"), options.get("base_artifact_sha256"),
                              options.get("base_image"))


def stack_options(project: "object") -> dict:
    """The ``[stack]`` switches of the folder's ``rayito-constructs.toml`` (context wins)."""
    stack = project.fleet.stack  # type: ignore[attr-defined]
    given = stack.model_fields_set
    return {key: getattr(stack, key) for key in given}


if __name__ == "__main__":
    raise SystemExit(main())

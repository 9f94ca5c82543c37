#!/usr/bin/env python3
"""Synthesize the fleet of one agent folder.

    npx cdk synth                                   # examples/mi-agente
    npx cdk synth -c project=path/to/agent          # another agent folder
    npx cdk synth -c min_vms=2 -c max_vms=4         # the same overrides as `plan`
    npx cdk synth -c image_arn=arn:aws:lambda:...   # a MicroVM image published elsewhere
    npx cdk synth -c metadata_index=true            # with the session index

Every option of ``rayito-constructs plan`` is accepted as context under its library name
(``min_vms``, ``memory_mib``, ``idle``, ``env=A=1,B=2``, ``save_recipe=false``...). Bad input
prints one line per problem and exits with status 2.
"""

from __future__ import annotations

import os
import sys

# jsii starts Node.js when aws_cdk is imported and prints a banner on Node 20 (end of life since
# 2026-10-30; this project is tested on it): silenced here too for `npx cdk synth` outside make.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk  # noqa: E402

from rayito_constructs import AgentProject, FleetStack, ProjectError  # noqa: E402
from rayito_constructs.overrides import READERS, read_overrides  # noqa: E402

DEFAULT_PROJECT = "examples/mi-agente"


def _flag(value: object) -> bool:
    return str(value).strip().lower() in {"true", "1", "yes", "on"}


def main() -> None:
    app = cdk.App()
    context = app.node.try_get_context
    folder = context("project") or DEFAULT_PROJECT
    raw = {key: context(key) for key in READERS if context(key) is not None}
    try:
        project = AgentProject.load(folder, **read_overrides(raw))
        FleetStack(
            app,
            f"RayitoFleet-{project.name}",
            project=project,
            image_arn=context("image_arn"),
            metadata_index=_flag(context("metadata_index")),
            keep_recipe=_flag(context("keep_recipe")),
            scope_microvm_actions_to_image=context("scope_microvm_actions_to_image") is None
            or _flag(context("scope_microvm_actions_to_image")),
            env=cdk.Environment(
                account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION")
            ),
        )
    except (ProjectError, ValueError) as exc:
        problems = exc.problems if isinstance(exc, ProjectError) else [exc]
        for problem in problems:
            print(problem, file=sys.stderr)
        raise SystemExit(2)
    app.synth()


if __name__ == "__main__":
    main()

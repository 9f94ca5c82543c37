"""What ``rayito agent deploy`` uploads for a project, composed from the product's own functions.

Pure apart from a temporary folder: the product's ``ProjectService.build`` writes the agent's
build context (``AgentTemplate.context_files``, the app folder) to a temporary folder, collects the
files its template copies and lays them over the base image's zip (``assemble_artifact``). This
module makes the same calls in the same order, so the bytes are the product's; it is shared by
synth (``AgentImage`` with a local ``rayd`` zip) and the ``image_composer`` Lambda (the base zip
read from S3 at deploy). Nothing here calls AWS.

The product's functions are imported, never copied; the private names used are listed in
``PRODUCT_FUNCTIONS`` so that a product upgrade that moves one fails one test, not a deploy.
"""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Mapping, Optional

from rayito._agent._project_base import installable_runtime, project_template, template_name
from rayito._agent._template import _write_context
from rayito._images import DEFAULT_MEMORY_MIB, inherited_configuration
from rayito._images_publish_domain import (
    ALL_OS_CAPABILITIES,
    ImageBuildSettings,
    log_group_for,
)
from rayito._images_publish_domain import desired_configuration as base_configuration
from rayito._limits import AGENT_MIN_MEMORY_MIB, SUPPORTED_MEMORY_MIB
from rayito._templates._artifact import assemble_artifact, read_zip_entries
from rayito._templates._build import desired_configuration as template_configuration
from rayito._templates._context import collect_context_files
from rayito._templates._dockerfile import TEMPLATE_ENV_CONTEXT_PATH
from rayito._templates._instructions import CopyStep
from rayito.cli._artifact import RAYD_ENTRY

#: The product's names this module depends on (checked by tests/test_agent_image.py).
PRODUCT_FUNCTIONS = (project_template, template_name, installable_runtime, _write_context, collect_context_files,
                     assemble_artifact, read_zip_entries, inherited_configuration, template_configuration,
                     base_configuration)
#: The base ``rayito setup --caps-image`` publishes and ``rayito agent deploy`` composes on.
CAPS_BASE_NAME = "rayito-base-caps"
#: Where ``rayd`` reads the variables it hands to every process (``rayito.template-env/1``).
TEMPLATE_ENV_PATH = TEMPLATE_ENV_CONTEXT_PATH
#: Ports the product refuses for the app: rayd's gRPC port and the hooks' port.
RAYD_PORT = 8080
HOOKS_PORT = 9000
#: Re-exported for the construct's error messages.
MEMORY_FLOOR_MIB = AGENT_MIN_MEMORY_MIB
MEMORY_CLASSES_MIB = tuple(SUPPORTED_MEMORY_MIB)


class CompositionError(ValueError):
    """A project or base zip the product could not compose: one line, what and what is allowed."""


def agent_template(project: Any) -> Any:
    """The product's ``AgentTemplate`` of ``project`` (its runtime checked as installable)."""
    try:
        return project_template(project)
    except Exception as exc:  # the product's InvalidArgumentException and friends, as one line
        raise CompositionError(f"runtime: the product cannot build this project ({_line(exc)})") from None


def check_base_zip(base_zip: bytes, *, where: str = "rayd") -> None:
    """The zip is a base the product composes on: a readable zip holding ``rayd`` at its root."""
    try:
        entries = read_zip_entries(base_zip)
    except zipfile.BadZipFile:
        raise CompositionError(f"{where}: not a zip file (the product's rayito-image.zip is one)") from None
    if RAYD_ENTRY not in entries:
        raise CompositionError(f"{where}: the zip has no {RAYD_ENTRY!r} at its root, so VMs of the image would "
                               "not run rayd (give the product's rayito-image.zip)")


def compose_artifact(project: Any, base_zip: bytes, *, template_env: Optional[Mapping[str, str]] = None) -> bytes:
    """The zip ``ProjectService(project).build()`` uploads when its base's zip is ``base_zip``,
    with ``template_env`` added through the product's ``set_envs`` (``template-env.json``, which
    rayd hands to every process). Same inputs, same bytes."""
    check_base_zip(base_zip)
    agent = agent_template(project)
    with tempfile.TemporaryDirectory(prefix="rayito-constructs-image-") as tmp:
        context = _write_context(Path(tmp), agent.context_files(), agent.app, agent.app_exclude)
        template = agent.to_template()
        if template_env:
            template = template.set_envs(dict(sorted(template_env.items())))
        spec = template.spec
        copies = [step for step in spec.steps if isinstance(step, CopyStep)]
        return assemble_artifact(base_zip, spec, collect_context_files(context, copies))


def artifact_key(artifact: bytes) -> str:
    """The product's content-addressed key for a composed artifact (``rayito/templates/<sha>.zip``)."""
    return f"rayito/templates/{hashlib.sha256(artifact).hexdigest()}.zip"


def caps_base_configuration(*, region: str, base_image_version: str, artifact_uri: str,
                            build_role_arn: str) -> dict[str, Any]:
    """What ``rayito setup --caps-image`` declares for ``rayito-base-caps``: the product's publish
    configuration (hooks, ARM_64, ``ALL`` capabilities, the managed base)."""
    settings = ImageBuildSettings(image_name=CAPS_BASE_NAME, base_image_version=base_image_version,
                                  memory_mib=DEFAULT_MEMORY_MIB,
                                  os_capabilities=ALL_OS_CAPABILITIES)
    return base_configuration(region=region, settings=settings, artifact_uri=artifact_uri,
                              build_role_arn=build_role_arn)


def agent_configuration(*, base: Mapping[str, Any], artifact_uri: str, memory_mib: int,
                        image_name: str) -> dict[str, Any]:
    """The ``create-microvm-image`` body ``rayito agent deploy`` sends for the project's image:
    what its base declared (hooks, capabilities, build role...) plus the artifact, memory and the
    image's own log group (``/rayito/<name>``)."""
    return template_configuration(artifact_uri=artifact_uri, memory_mb=memory_mib, base_image_version=dict(base),
                                  log_group=log_group_for(image_name))


def template_env_of(artifact: bytes) -> dict[str, str]:
    """The variables a composed zip hands to every process (empty when it has none)."""
    entries = read_zip_entries(artifact)
    raw = entries.get(TEMPLATE_ENV_PATH)
    if raw is None:
        return {}
    return dict(json.loads(raw.decode("utf-8")).get("envs") or {})


def has_rayd(artifact: bytes) -> bool:
    """Whether a zip ships ``rayd`` at its root."""
    try:
        with zipfile.ZipFile(io.BytesIO(artifact)) as archive:
            return RAYD_ENTRY in archive.namelist()
    except zipfile.BadZipFile:
        return False


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__

"""What ``rayito agent deploy`` uploads for a project, composed from the product's own functions.

The product's ``ProjectService.build`` writes the agent's build context to a temporary folder
(``AgentTemplate.context_files``, the app folder), collects the files its template copies and lays
them over the base image's zip (``assemble_artifact``). The calls themselves live in the code that
runs in AWS, ``lambdas/reconciler/composition.py`` (shipped in the wheel as
``rayito_constructs._lambdas``), so that synth (``AgentImage`` over a release zip or a
``RayitoMicrovmImage``) and the image composer (the base zip read from S3 at deploy) run the same
functions; this module adds what only synth needs (the product's template of a project, the
image's configuration). Nothing here calls AWS.

The product's functions are imported, never copied; the private names used are listed in
``PRODUCT_FUNCTIONS`` so that a product upgrade that moves one fails one test, not a deploy.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any, Mapping, Optional

from rayito._agent._project_base import installable_runtime, project_template, template_name
from rayito._agent._install_plan import NODE_LOCKFILES
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
from rayito._templates._build import fetch_base_artifact, resolve_base_version
from rayito._templates._context import collect_context_files
from rayito._templates._dockerfile import TEMPLATE_ENV_CONTEXT_PATH
from rayito.cli._artifact import RAYD_ENTRY
from rayito.exceptions import SandboxException

from ._lambdas.reconciler.composition import (
    DECLARED_KEYS,
    CompositionError as CompositionError,
    artifact_key as artifact_key,
    check_base_zip as check_base_zip,
    compose,
    template_overlay,
)

#: The product's names this module depends on (checked by tests/test_agent_image.py).
PRODUCT_FUNCTIONS = (project_template, template_name, installable_runtime, _write_context, collect_context_files,
                     assemble_artifact, read_zip_entries, inherited_configuration, template_configuration,
                     base_configuration, resolve_base_version, fetch_base_artifact)
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


def agent_template(project: Any, *, base_version: Optional[str] = None) -> Any:
    """The product's ``AgentTemplate`` of ``project`` (its runtime checked as installable)."""
    try:
        return project_template(project, base_version=base_version)
    except Exception as exc:  # the product's InvalidArgumentException and friends, as one line
        raise CompositionError(f"runtime: the product cannot build this project ({_line(exc)})") from None


def compose_artifact(project: Any, base_zip: bytes, *, template_env: Optional[Mapping[str, str]] = None) -> bytes:
    """The zip ``ProjectService(project).build()`` uploads when its base's zip is ``base_zip``,
    with ``template_env`` added through the product's ``set_envs`` (``template-env.json``, which
    rayd hands to every process). Same inputs, same bytes. Made through the overlay the image
    composer receives at deploy (:func:`build_context`), so both compose alike."""
    check_base_zip(base_zip)
    return compose(base_zip, build_context(project, template_env=template_env))


def build_context(project: Any, *, template_env: Optional[Mapping[str, str]] = None,
                  base_version: Optional[str] = None) -> bytes:
    """The project's side of the composition (the template's spec and its context files), as
    the overlay zip the image composer lays over a base published in the account;
    ``base_version`` pins that base's version as the product's ``base_version`` does."""
    template = agent_template(project, base_version=base_version)
    try:
        return template_overlay(template, template_env)
    except SandboxException as exc:  # the product's BuildException: a file its build copies is missing
        reason = getattr(exc, "reason", None)
        raise CompositionError(f"source: the product cannot build this project's image ({_line(exc)}"
                               f"{f'; {reason}' if reason else ''}){_hint(exc)}") from None
    except (OSError, UnicodeError, ValueError) as exc:  # a file it cannot read, a name a zip cannot hold
        raise CompositionError(f"source: the project's files cannot be packed into its image ({_line(exc)})") from None


def image_problem(project: Any) -> Optional[str]:
    """Why the product cannot build ``project``'s agent image, in one line, or None (what
    ``rayito agent deploy`` would refuse at its build, and a fleet that builds the image at synth)."""
    try:
        build_context(getattr(project, "product", project))
    except CompositionError as exc:
        return str(exc)
    return None


def _hint(exc: BaseException) -> str:
    """A Node project's lockfile is the usual missing file: its build runs ``npm ci``."""
    missing = str(exc).rsplit("/", 1)[-1].strip()
    manager = {lockfile: name for name, lockfile in NODE_LOCKFILES.items()}.get(missing)
    return (f": the source folder must hold {missing}, not excluded from the build context ({manager} install "
            "writes it)") if manager else ""


def caps_base_configuration(*, region: str, base_image_version: str, artifact_uri: str,
                            build_role_arn: str, base_name: str = CAPS_BASE_NAME) -> dict[str, Any]:
    """What ``rayito setup`` declares for ``base_name``: the product's publish configuration
    (hooks, ARM_64, the managed base), with ``ALL`` capabilities for ``rayito-base-caps``
    (``--caps-image``) and none for another (``rayito-base``, ``rayito image publish``'s default)."""
    settings = ImageBuildSettings(image_name=base_name, base_image_version=base_image_version,
                                  memory_mib=DEFAULT_MEMORY_MIB,
                                  os_capabilities=ALL_OS_CAPABILITIES if base_name == CAPS_BASE_NAME else None)
    return base_configuration(region=region, settings=settings, artifact_uri=artifact_uri,
                              build_role_arn=build_role_arn)


def declared_inheritance(base: Mapping[str, Any]) -> dict[str, Any]:
    """What an agent image inherits from ``base`` that the image composer checks at deploy
    (``DECLARED_KEYS``: hooks, capabilities, architecture, environment, connectors)."""
    return {key: base[key] for key in DECLARED_KEYS if base.get(key)}


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

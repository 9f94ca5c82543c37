"""What ``rayito agent deploy`` uploads for a project, composed with the product's own functions.

Shared by synth (``rayito_constructs.image_composition``: ``AgentImage`` over a release zip or a
``RayitoMicrovmImage`` of the app) and the image composer (``composer.py``: the base image's zip
read from S3 at deploy), so both make the same bytes from the same inputs. The product's
``ProjectService.build`` writes the agent's build context to a temporary folder
(``_write_context``), collects the files its template copies (``collect_context_files``) and lays
them over the base's zip (``assemble_artifact``). This module splits that at the one seam where
the base comes in:

* :func:`template_overlay` (synth only): all that depends on the project, the template's spec
  (with the fleet's ``set_envs``) and the collected context files, as one deterministic zip, the
  *overlay*, which travels to the deploy as a file asset;
* :func:`compose` (synth and deploy): all that depends on the base, the base zip checked and the
  product's ``assemble_artifact`` over it.

Synth composes through the very overlay bytes (``rayito_constructs.image_composition``), so the
test that proves its zip equal to the product's upload proves the overlay's round trip too. Pure
apart from a temporary folder at synth: no AWS call, no boto3, no CDK.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from rayito._agent._template import _write_context
from rayito._templates._artifact import ZIP_FIXED_DATE_TIME, assemble_artifact, read_zip_entries
from rayito._templates._context import collect_context_files
from rayito._templates._instructions import (
    BaseImageRef,
    CopyStep,
    EnvStep,
    ReadyPoll,
    RunStep,
    StartSpec,
    TemplateSpec,
    UserStep,
    WorkdirStep,
)
from rayito.cli._artifact import RAYD_ENTRY

#: The overlay's format; a reader refuses any other.
OVERLAY_SCHEMA = "rayito-constructs.template-overlay/1"
OVERLAY_SPEC = "overlay.json"
OVERLAY_FILES = "context/"
#: What an agent image inherits from its base besides the managed base itself (the product's
#: ``INHERITED_CONFIGURATION_KEYS`` less ``baseImageArn``, ``baseImageVersion`` and
#: ``buildRoleArn``): declared at synth, checked against the base's version at deploy.
DECLARED_KEYS = ("hooks", "cpuConfigurations", "additionalOsCapabilities", "environmentVariables",
                 "egressNetworkConnectors")
#: The product's wire steps, by class name (``TemplateSpec.steps``).
STEP_TYPES: dict[str, Any] = {cls.__name__: cls for cls in (CopyStep, EnvStep, RunStep, WorkdirStep, UserStep)}


class CompositionError(ValueError):
    """A project or base zip the product could not compose: one line, what and what is allowed."""


def check_base_zip(base_zip: bytes, *, where: str = "rayd") -> None:
    """The zip is a base the product composes on: a readable zip holding ``rayd`` at its root."""
    try:
        entries = read_zip_entries(base_zip)
    except zipfile.BadZipFile:
        raise CompositionError(f"{where}: not a zip file (the product's rayito-image.zip is one)") from None
    if RAYD_ENTRY not in entries:
        raise CompositionError(f"{where}: the zip has no {RAYD_ENTRY!r} at its root, so VMs of the image would "
                               "not run rayd (give the product's rayito-image.zip)")


def template_overlay(agent: Any, template_env: Optional[Mapping[str, str]] = None) -> bytes:
    """The overlay of the product's ``AgentTemplate`` ``agent``: its context written and
    collected as ``AgentTemplate.build`` does, its spec with ``template_env`` added through the
    product's ``set_envs`` (``template-env.json``, which rayd hands to every process)."""
    with tempfile.TemporaryDirectory(prefix="rayito-constructs-image-") as tmp:
        context = _write_context(Path(tmp), agent.context_files(), agent.app, agent.app_exclude)
        template = agent.to_template()
        if template_env:
            template = template.set_envs(dict(sorted(template_env.items())))
        spec: TemplateSpec = template.spec
        copies = [step for step in spec.steps if isinstance(step, CopyStep)]
        files = collect_context_files(context, copies)
    return encode_overlay(spec, files)


def compose(base_zip: bytes, overlay: bytes, *, where: str = "rayd") -> bytes:
    """The zip the product's build uploads when its base's zip is ``base_zip``: the overlay's
    spec and files laid over it by the product's ``assemble_artifact``. Same inputs, same bytes."""
    check_base_zip(base_zip, where=where)
    spec, files = read_overlay(overlay)
    return assemble_artifact(base_zip, spec, files)


def artifact_key(artifact: bytes, prefix: str = "rayito/templates") -> str:
    """The content-addressed key of a composed zip: ``<prefix>/<sha256>.zip`` (the product's
    ``rayito/templates/<sha>.zip`` by default)."""
    return f"{prefix.rstrip('/')}/{hashlib.sha256(artifact).hexdigest()}.zip"


# ------------------------------------------------------------------ the overlay


def encode_overlay(spec: TemplateSpec, files: Sequence[tuple[str, bytes]]) -> bytes:
    """``spec`` and the context files as a deterministic zip (same inputs, same bytes); refused
    when the spec would not come back equal (a product whose spec this format does not carry)."""
    document = {"schema": OVERLAY_SCHEMA, "spec": encode_spec(spec), "files": [name for name, _ in files]}
    if decode_spec(json.loads(json.dumps(document["spec"]))) != spec:
        raise CompositionError("the product's template spec does not survive the trip to the deploy "
                               f"({OVERLAY_SCHEMA}); compose at synth from a release zip (base_artifact)")
    entries = {OVERLAY_SPEC: (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()}
    entries.update((f"{OVERLAY_FILES}{name}", data) for name, data in files)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=ZIP_FIXED_DATE_TIME)
            info.external_attr = 0o644 << 16
            archive.writestr(info, entries[name])
    return buffer.getvalue()


def read_overlay(overlay: bytes) -> tuple[TemplateSpec, list[tuple[str, bytes]]]:
    """``(spec, files)`` of an overlay, the files in the order the product collected them."""
    try:
        entries = read_zip_entries(overlay)
        document = json.loads(entries[OVERLAY_SPEC].decode("utf-8"))
        if not isinstance(document, dict) or document.get("schema") != OVERLAY_SCHEMA:
            raise ValueError(f"not {OVERLAY_SCHEMA}")
        files = [(str(name), entries[f"{OVERLAY_FILES}{name}"]) for name in document["files"]]
        return decode_spec(document["spec"]), files
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError) as exc:
        raise CompositionError(f"the project's build context is not a {OVERLAY_SCHEMA} zip ({type(exc).__name__})") from None


def encode_spec(spec: TemplateSpec) -> dict[str, Any]:
    """The product's ``TemplateSpec`` as JSON values (each step tagged with its class)."""
    steps = []
    for step in spec.steps:
        if type(step).__name__ not in STEP_TYPES:
            raise CompositionError(f"the product's template has a {type(step).__name__} step, which this library "
                                   "cannot carry to the deploy; compose at synth from a release zip (base_artifact)")
        steps.append({"step": type(step).__name__, **dataclasses.asdict(step)})
    return {
        "base": dataclasses.asdict(spec.base) if spec.base is not None else None,
        "steps": steps,
        "start": dataclasses.asdict(spec.start) if spec.start is not None else None,
        "skip_cache": spec.skip_cache,
    }


def decode_spec(data: Mapping[str, Any]) -> TemplateSpec:
    """:func:`encode_spec` undone."""
    base = BaseImageRef(**data["base"]) if data.get("base") is not None else None
    steps = []
    for raw in data["steps"]:
        fields = dict(raw)
        steps.append(STEP_TYPES[fields.pop("step")](**fields))
    start = None
    if data.get("start") is not None:
        fields = dict(data["start"])
        fields["envs"] = tuple((str(key), str(value)) for key, value in fields.get("envs") or ())
        poll = fields.get("ready_poll")
        fields["ready_poll"] = ReadyPoll(**poll) if poll is not None else None
        start = StartSpec(**fields)
    return TemplateSpec(base=base, steps=tuple(steps), start=start, skip_cache=bool(data.get("skip_cache")))

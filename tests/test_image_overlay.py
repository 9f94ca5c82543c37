"""The overlay, the project's side of a composition that travels from synth to the image composer
(``lambdas/reconciler/composition.py``), pure and table-driven: a spec comes back equal or is
refused at synth, a build context that is not an overlay and a base that is not a zip are refused
in one line, never composed over. The bytes themselves are proved equal to the product's upload
in tests/test_agent_image.py and tests/test_image_composer_handler.py."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass

import pytest
from rayito._templates import _instructions as wire
from rayito._templates._instructions import RunStep, StartSpec, TemplateSpec

from lambdas.reconciler.composition import (
    OVERLAY_SCHEMA,
    OVERLAY_SPEC,
    CompositionError,
    check_base_zip,
    encode_overlay,
    encode_spec,
    read_overlay,
)

FILES = [("app/main.py", b"print('hola')\n"), ("app/requirements.txt", b"")]
STEPS = (wire.WorkdirStep("/opt/agents"), wire.CopyStep("app", "/opt/agents/app"), wire.EnvStep("MODE", "fleet"),
         RunStep("pip install -r app/requirements.txt"), wire.UserStep("agent"))


def zipped(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def document(**changed: object) -> bytes:
    data = {"schema": OVERLAY_SCHEMA, "spec": encode_spec(TemplateSpec(steps=STEPS)), "files": ["app/main.py"]}
    return json.dumps({**data, **changed}).encode()


@pytest.mark.parametrize("spec", [
    TemplateSpec(steps=STEPS),  # no base, no start: what a Dockerfile-less template has
    TemplateSpec(base=wire.BaseImageRef("published", "rayito-base-caps", "3"), steps=STEPS, skip_cache=True,
                 start=StartSpec("python app/main.py", ready_cmd="test -f /tmp/ready", workdir="/opt/agents",
                                 envs=(("PORT", "9100"),), ready_poll=wire.ReadyPoll(0.5, 30.0))),
    TemplateSpec(start=StartSpec("python app/main.py")),  # a start with no poll, no envs
])
def test_a_spec_and_its_files_come_back_as_they_went(spec) -> None:
    overlay = encode_overlay(spec, FILES)
    assert read_overlay(overlay) == (spec, FILES)
    assert encode_overlay(spec, FILES) == overlay  # same inputs, same bytes


@dataclass(frozen=True)
class ArgStep:
    """A wire step the overlay's format does not carry (a product that added one)."""

    name: str


@pytest.mark.parametrize("spec, said", [
    (TemplateSpec(steps=(RunStep("true"), ArgStep("X"))),  # type: ignore[arg-type]
     "the product's template has a ArgStep step, which this library cannot carry to the deploy"),
    # A value JSON would give back as another type: the spec the deploy read would not be this one.
    (TemplateSpec(start=StartSpec("serve", envs=(("PORT", 9100),))),  # type: ignore[arg-type]
     f"the product's template spec does not survive the trip to the deploy ({OVERLAY_SCHEMA})"),
])
def test_a_spec_the_overlay_cannot_carry_is_refused_at_synth(spec, said) -> None:
    with pytest.raises(CompositionError) as refused:
        encode_overlay(spec, FILES)
    assert str(refused.value).startswith(said)


@pytest.mark.parametrize("overlay, kind", [
    (b"PK\x03\x04 not really", "BadZipFile"),
    (zipped({"context/app/main.py": b""}), "KeyError"),  # no overlay.json
    (zipped({OVERLAY_SPEC: document(schema="rayito-constructs.template-overlay/0")}), "ValueError"),
    (zipped({OVERLAY_SPEC: b"[1, 2]"}), "ValueError"),  # JSON, not an object
    (zipped({OVERLAY_SPEC: b"{not json"}), "JSONDecodeError"),
    (zipped({OVERLAY_SPEC: document()}), "KeyError"),  # names a file it does not hold
    (zipped({OVERLAY_SPEC: document(spec={"steps": [{"step": "RunStep", "command": "x"}]}),
             "context/app/main.py": b""}), "TypeError"),  # a step with other fields
])
def test_a_build_context_that_is_not_an_overlay_is_refused_in_one_line(overlay, kind) -> None:
    with pytest.raises(CompositionError) as refused:
        read_overlay(overlay)
    assert str(refused.value) == f"the project's build context is not a {OVERLAY_SCHEMA} zip ({kind})"


def test_a_base_that_is_not_a_zip_is_refused_before_composing() -> None:
    with pytest.raises(CompositionError) as refused:
        check_base_zip(b"<Error>AccessDenied</Error>", where="base image rayito-base-caps version 2.0")
    assert str(refused.value) == ("base image rayito-base-caps version 2.0: not a zip file (the product's "
                                  "rayito-image.zip is one)")

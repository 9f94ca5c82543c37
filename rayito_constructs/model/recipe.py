"""The fleet recipe: the product's own document, saved at ``/rayito/agents/<name>/recipe``.

The recipe is what ``rayito agent deploy`` saves for the same project, flags and image version,
byte for byte: the product builds the document (``recipe_of``/``recipe_document``: the schema
``rayito.agent-recipe/1``, the project's canonical ``to_dict()``, the scaling, the gateway presets)
and encodes it (canonical JSON when it fits the 4,096 bytes of a standard parameter, else the
``gzip+base64`` envelope, else nothing: ``recipe_too_large``). This module only decides, at synth,
what the stack ships and whether it fits (pure: no CDK, no AWS).

The image version is in the recipe. When the stack builds the image, it is only known at deploy:
the stack ships the document without it, and the recipe writer (``lambdas/recipe_writer``) puts
the version CloudFormation resolved into it with the product's code and encodes it there. At
synth such a recipe is sized with :data:`VERSION_STAND_IN`, the longest version the writer takes.
A recipe that records no version at all (an image published elsewhere, named by ARN) is planned
with the warning ``recipe_without_image_version`` (this library's: the product saves such a
recipe without a word, and a client that connects then runs the image's latest active version).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from .errors import FleetWarning
from .product import PRODUCT_VERSION, canonical_json, encode, encoding_of, recipe, recipe_parameter_name, with_version
from .project import AgentProject

STANDARD_PARAMETER_BYTES = 4096
#: The longest image version the recipe writer accepts (``^[0-9]{1,9}(\.[0-9]{1,9})?$``): a
#: recipe whose version is known only at deploy must fit with it.
VERSION_STAND_IN = "999999999.999999999"
PARAMETER_PREFIX = "/rayito/agents/"

Encoding = Literal["json", "gzip+base64"]


@dataclass(frozen=True)
class EncodedRecipe:
    """A recipe ready for Parameter Store: the ``value`` string, its ``encoding`` and size."""

    value: str
    encoding: Encoding
    bytes: int
    json_bytes: int


def encoded(document: dict[str, object], value: Optional[str]) -> Optional[EncodedRecipe]:
    """The stored form of ``document`` (``value`` as the product encoded it), or None."""
    if value is None:
        return None
    json_bytes = len(canonical_json(document).encode())
    encoding: Encoding = "gzip+base64" if encoding_of(value) == "gzip+base64" else "json"
    return EncodedRecipe(value=value, encoding=encoding, bytes=len(value.encode()), json_bytes=json_bytes)


@dataclass(frozen=True)
class RecipePlan:
    """What a deploy of a project writes, or why it writes nothing.

    ``document`` is what the stack ships: the product's recipe document, without an image version
    when the version is only known at deploy (``version_at_deploy``; the writer then adds it).
    ``encoded`` is how it will be stored; for a deploy-time version, sized with the stand-in.
    """

    parameter_name: str
    encoded: Optional[EncodedRecipe]
    warnings: tuple[FleetWarning, ...]
    document: Optional[dict[str, Any]] = None
    image_version: Optional[str] = None
    version_at_deploy: bool = False
    reason: Optional[str] = None
    """Why nothing is saved, when nothing is (``save_recipe`` off, or the warning's text)."""

    def to_dict(self) -> dict[str, Any]:
        if self.encoded is None:
            return {"parameter_name": self.parameter_name, "saved": False, "reason": self.reason}
        return {
            "parameter_name": self.parameter_name,
            "saved": True,
            "schema": (self.document or {}).get("schema"),
            "saved_by": (self.document or {}).get("savedBy"),
            "encoding": self.encoded.encoding,
            "bytes": self.encoded.bytes,
            "json_bytes": self.encoded.json_bytes,
            "image_version": "at deploy" if self.version_at_deploy else self.image_version,
            "document": self.document,
        }


def parameter_name(fleet_name: str) -> str:
    """``/rayito/agents/<name>/recipe``."""
    return f"{PARAMETER_PREFIX}{fleet_name}/recipe"


def _is_token(value: Optional[str]) -> bool:
    return value is not None and "${Token[" in value


def plan_recipe(project: AgentProject, image_version: Optional[str] = None, *,
                builds_image: bool = False) -> RecipePlan:
    """Decide what the deploy writes: the product's encoded recipe, or nothing and why.

    :param image_version: the version to record; a CDK token when the stack builds the image (the
        writer fills it in at deploy). Default: none.
    :param builds_image: the stack builds the image, so the version is known at deploy.
    """
    name = parameter_name(project.name)
    if recipe_parameter_name(project.name) is None:  # unreachable under this library's name rule
        reason = f"a fleet named {project.name!r} has no recipe parameter"
        return RecipePlan(name, None, (FleetWarning("recipe_not_saved", reason),), reason=reason)
    if not project.save_recipe:
        return RecipePlan(name, None, (), reason="save_recipe is off (--no-save-recipe): no recipe is saved")
    at_deploy = _is_token(image_version) or (image_version is None and builds_image)
    known = None if at_deploy else image_version
    deploy_value = image_version if _is_token(image_version) else None  # the token the writer resolves
    fleet_recipe = recipe(project.product, project.product_scaling,
                          renew_gateway_keys=project.renew_gateway_keys, image_version=known)
    document, value = encode(fleet_recipe)
    if at_deploy:  # it must still fit once the deploy fills the version in
        _, value = encode(with_version(document, VERSION_STAND_IN))
    warnings: tuple[FleetWarning, ...] = ()
    if known is None and not at_deploy:
        warnings = (FleetWarning(
            "recipe_without_image_version",
            "the recipe records no image version: the stack does not build the image and image_arn names no "
            "version, so a client that connects by name runs the image's latest active version"),)
    stored = encoded(document, value)
    if stored is None:
        size = len(canonical_json(document).encode())
        reason = (f"the recipe is {size} bytes as JSON and does not fit the {STANDARD_PARAMETER_BYTES} bytes of a "
                  "standard parameter even as gzip+base64: no recipe is saved, and the previous one is deleted")
        return RecipePlan(name, None, (FleetWarning("recipe_too_large", reason),), document,
                          deploy_value or known, at_deploy, reason=reason)
    return RecipePlan(name, stored, warnings, document, deploy_value or known, at_deploy)


def no_reconciler(plan: RecipePlan) -> Optional[FleetWarning]:
    """The warning ``no_reconciler`` of a fleet that saves no recipe and was not told whether to
    run the reconciler (``plan`` and the synth say it alike); None when a recipe is saved."""
    if plan.encoded is not None:
        return None
    return FleetWarning("no_reconciler", f"{plan.reason}, so the stack keeps no fleet (the reconciler starts VMs "
                                         "from the project the recipe holds); VMs start when a client connects")


def reconciler_on(reconciler: Optional[bool], plan: RecipePlan) -> bool:
    """Whether the stack runs the reconciler: as told, else when a recipe is saved (it starts
    VMs from the project the recipe holds). ``AgentFleet`` and ``plan`` decide it here."""
    return plan.encoded is not None if reconciler is None else reconciler


def reconciler_needs_recipe(plan: RecipePlan) -> str:
    """Why ``reconciler=True`` is refused for a fleet that saves no recipe."""
    return (f"reconciler: True needs the fleet's recipe, and {plan.reason}; the reconciler starts the fleet's "
            "VMs from the project the recipe holds (pass reconciler=False for a fleet the stack does not keep)")


__all__ = ["PRODUCT_VERSION", "EncodedRecipe", "RecipePlan", "VERSION_STAND_IN", "no_reconciler", "parameter_name",
           "plan_recipe", "reconciler_needs_recipe", "reconciler_on"]

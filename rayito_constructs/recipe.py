"""The fleet recipe: the document saved at ``/rayito/agents/<name>/recipe`` (pure, no CDK, no AWS).

The recipe is the project as it ended up after overrides: env, secret env *names*, the egress
allow-list, gateways and their presets, the image and its version, the scaling, and whether
gateway keys are renewed. It never holds a secret value or an access token.

Encoding (product page, "The fleet recipe", "Size"):

* JSON when it fits in 4,096 bytes, the size of a standard SSM parameter;
* otherwise compressed: ``rz1:`` followed by the base64 of the zlib-compressed JSON;
* when even that does not fit, there is no recipe and the warning is ``recipe_too_large``.

The JSON is canonical (sorted keys, no spaces, UTF-8), so the same project gives the same bytes
and a redeploy never rewrites a parameter that did not change.

The image version is in the recipe in every encoding. When the stack builds the image, the version
is only known at deploy: the stack ships the document, and the recipe writer sets the version
CloudFormation resolved and encodes it there, with these same rules (``lambdas/recipe_writer``;
a test checks both encoders agree). A recipe that records no version at all (an image published
elsewhere and no ``[image] version``) is planned with the warning
``recipe_without_image_version``.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping, Optional

from .errors import FleetWarning
from .rates import parse_rate, recipe_rate

if TYPE_CHECKING:
    from .project import AgentProject

RECIPE_VERSION = 1
STANDARD_PARAMETER_BYTES = 4096
#: Stands in for a version known only at deploy when sizing the recipe at synth (versions are
#: ``<major>.0`` and count up with every build; 7 characters leave room for 99,999 builds).
VERSION_STAND_IN = "99999.0"
COMPRESSED_PREFIX = "rz1:"
PARAMETER_PREFIX = "/rayito/agents/"

Encoding = Literal["json", "compressed"]


class RecipeDecodeError(ValueError):
    """The stored value is not a recipe this library can read (the page's ``recipe_unreadable``)."""

    code = "recipe_unreadable"


class RecipeTooLarge(ValueError):
    """Even compressed, the recipe does not fit in a standard parameter (``recipe_too_large``)."""

    code = "recipe_too_large"

    def __init__(self, json_bytes: int, compressed_bytes: int):
        self.json_bytes = json_bytes
        self.compressed_bytes = compressed_bytes
        super().__init__(
            f"recipe_too_large: the recipe is {json_bytes} bytes as JSON and {compressed_bytes} "
            f"compressed, above the {STANDARD_PARAMETER_BYTES} bytes of a standard parameter"
        )


@dataclass(frozen=True)
class EncodedRecipe:
    """A recipe ready for Parameter Store: the ``value`` string, its ``encoding`` and size."""

    value: str
    encoding: Encoding
    bytes: int
    json_bytes: int


@dataclass(frozen=True)
class RecipePlan:
    """What a deploy of a project writes, or why it writes nothing.

    ``document`` is what the stack ships (its image version is ``None`` when the version is only
    known at deploy; ``image_version`` then holds that deploy-time value). ``encoded`` is the
    document encoded as it will be stored; with a deploy-time version it is the document without
    its version (checked to fit with a stand-in version, :data:`VERSION_STAND_IN`), and the writer
    encodes the real one.
    """

    parameter_name: str
    encoded: Optional[EncodedRecipe]
    warnings: tuple[FleetWarning, ...]
    document: Optional[dict[str, Any]] = None
    image_version: Optional[str] = None
    version_at_deploy: bool = False
    """True when the image version is filled in at deploy (the stack builds the image)."""

    def to_dict(self) -> Optional[dict[str, Any]]:
        if self.encoded is None:
            return None
        return {
            "parameter_name": self.parameter_name,
            "encoding": self.encoded.encoding,
            "bytes": self.encoded.bytes,
            "json_bytes": self.encoded.json_bytes,
            "image_version": "at deploy" if self.version_at_deploy else (self.document or {}).get("image", {}).get("version"),
        }


def parameter_name(fleet_name: str) -> str:
    """``/rayito/agents/<name>/recipe``."""
    return f"{PARAMETER_PREFIX}{fleet_name}/recipe"


def build_recipe(project: "AgentProject", image_version: Optional[str] = None) -> dict[str, Any]:
    """The recipe document of a project, as plain JSON-ready data. ``image_version`` overrides
    the project's (a CDK token when the stack builds the image: CloudFormation fills it in)."""
    doc: dict[str, Any] = {
        "version": RECIPE_VERSION,
        "name": project.name,
        "target": project.target,
        "image": {
            "memory_mib": project.image.memory_mib,
            "architecture": project.image.architecture,
            "version": image_version if image_version is not None else project.image.version,
        },
        "env": dict(project.env),
        "secret_env": list(project.secret_env),
        "egress": {
            "allow": list(project.egress.allow),
            "budgets": [
                {"target": b.target, "rate_per_second": recipe_rate(b.rate_per_second), "burst": b.burst}
                for b in project.egress.budgets
            ],
            "default": {"rate_per_second": _rate(project.egress.default_rate),
                        "burst": project.egress.default_burst},
        },
        "gateways": [g.model_dump(exclude_none=True, mode="json") for g in project.gateways],
        "gateway_presets": sorted({g.preset for g in project.gateways if g.preset}),
        "renew_gateway_keys": project.renew_gateway_keys,
    }
    if project.instructions is not None:
        doc["instructions"] = project.instructions
    if project.has_fleet:
        doc["serve"] = project.serve.model_dump(mode="json")
        scaling = project.scaling.model_dump(mode="json")
        scaling["idle_seconds"] = scaling.pop("idle")
        doc["scaling"] = scaling
    return doc


def _rate(value: Any) -> float:
    return recipe_rate(parse_rate(value))


def canonical_json(doc: Mapping[str, Any]) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the same document always gives the same bytes."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode_recipe(doc: Mapping[str, Any], limit: int = STANDARD_PARAMETER_BYTES) -> EncodedRecipe:
    """Encode a recipe for a standard parameter; raises :class:`RecipeTooLarge`."""
    raw = canonical_json(doc)
    if len(raw) <= limit:
        return EncodedRecipe(raw.decode(), "json", len(raw), len(raw))
    packed = COMPRESSED_PREFIX + base64.b64encode(zlib.compress(raw, 9)).decode("ascii")
    if len(packed) <= limit:
        return EncodedRecipe(packed, "compressed", len(packed), len(raw))
    raise RecipeTooLarge(len(raw), len(packed))


def decode_recipe(value: str) -> dict[str, Any]:
    """Read back either encoding; raises :class:`RecipeDecodeError`."""
    try:
        if value.startswith(COMPRESSED_PREFIX):
            raw = zlib.decompress(base64.b64decode(value[len(COMPRESSED_PREFIX) :], validate=True))
        else:
            raw = value.encode()
        doc = json.loads(raw)
    except (binascii.Error, zlib.error, UnicodeError, ValueError) as exc:
        raise RecipeDecodeError(f"recipe_unreadable: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), int):
        raise RecipeDecodeError("recipe_unreadable: not a recipe document (no version)")
    if doc["version"] > RECIPE_VERSION:
        raise RecipeDecodeError(
            f"recipe_unreadable: version {doc['version']} is newer than this library reads "
            f"({RECIPE_VERSION})"
        )
    return doc


def _is_token(value: Optional[str]) -> bool:
    return value is not None and "${Token[" in value


def _builds_image(project: "AgentProject") -> bool:
    return project.folder is not None and (project.folder / "Dockerfile").is_file()


def plan_recipe(
    project: "AgentProject", image_version: Optional[str] = None, *, builds_image: Optional[bool] = None
) -> RecipePlan:
    """Decide what the deploy writes: the encoded recipe, or nothing and the page's warning.

    :param image_version: the version to record; a CDK token when the stack builds the image (the
        writer fills it in at deploy). Default: the project's ``[image] version``.
    :param builds_image: whether the stack builds the image, which gives the recipe its version at
        deploy. Default: the project's folder has a Dockerfile (what ``AgentFleet`` does).
    """
    name = parameter_name(project.name)
    if project.name in (".", ".."):
        warning = FleetWarning(
            "recipe_not_saved", f"a fleet named {project.name!r} has no recipe; set name in rayito-agent.toml"
        )
        return RecipePlan(name, None, (warning,))
    if not project.save_recipe:
        warning = FleetWarning("recipe_not_saved", "save_recipe is off (--no-save-recipe): no recipe is saved")
        return RecipePlan(name, None, (warning,))
    at_deploy = _is_token(image_version) or (
        image_version is None and project.image.version is None and (builds_image if builds_image is not None else _builds_image(project))
    )
    deploy_value = image_version if _is_token(image_version) else None
    document = build_recipe(project, None if at_deploy else image_version)
    warnings: tuple[FleetWarning, ...] = ()
    if document["image"]["version"] is None and not at_deploy:
        warnings = (FleetWarning(
            "recipe_without_image_version",
            "the recipe records no image version: the stack does not build the image and [image] version is "
            "not set, so a process that connects by name runs the image's latest active version; set "
            "version in [image] to pin it",
        ),)
    try:
        encoded = encode_recipe(document)
        if at_deploy:  # it must still fit once the deploy fills the version in
            encode_recipe(build_recipe(project, VERSION_STAND_IN))
    except RecipeTooLarge as exc:
        return RecipePlan(name, None, (FleetWarning(exc.code, str(exc).split(": ", 1)[1]),), document, deploy_value, at_deploy)
    return RecipePlan(name, encoded, warnings, document, deploy_value, at_deploy)


def recipe_to_project_data(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """Turn a decoded recipe back into the tables of a ``rayito-agent.toml``."""
    data: dict[str, Any] = {
        "target": recipe.get("target", "microvm"),
        "env": dict(recipe.get("env", {})),
        "secret_env": list(recipe.get("secret_env", [])),
        "renew_gateway_keys": bool(recipe.get("renew_gateway_keys", False)),
        "gateways": [dict(g) for g in recipe.get("gateways", [])],
    }
    image = {k: v for k, v in dict(recipe.get("image", {})).items() if v is not None}
    if image:
        data["image"] = image
    egress = dict(recipe.get("egress", {}))
    table: dict[str, Any] = {}
    if egress.get("allow"):
        table["allow"] = list(egress["allow"])
    if egress.get("budgets"):
        table["budgets"] = [{"target": b["target"], "rate": b["rate_per_second"], "burst": b["burst"]}
                            for b in egress["budgets"]]
    if egress.get("default"):
        table["default_rate"] = egress["default"]["rate_per_second"]
        table["default_burst"] = egress["default"]["burst"]
    if table:
        data["egress"] = table
    if "instructions" in recipe:
        data["instructions"] = recipe["instructions"]
    if "serve" in recipe:
        data["serve"] = dict(recipe["serve"])
    if "scaling" in recipe:
        scaling = {k: v for k, v in dict(recipe["scaling"]).items() if v is not None}
        if "idle_seconds" in scaling:
            scaling["idle"] = scaling.pop("idle_seconds")
        data["scaling"] = scaling
    return data

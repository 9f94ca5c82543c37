"""``rayito-constructs.toml``: what a CDK fleet adds to the product's ``rayito-agent.toml``.

The product's loader refuses every key it does not know, so this library's settings live in a file
of its own next to the project file (optional: props and ``-c`` context say the same, and win):

.. code-block:: toml

    [egress]                      # one shared rate envelope per external target (docs/egress-budgets.md)
    default_rate = "120/minute"   # a target no budget declares
    default_burst = 10

    [[egress.budgets]]
    target = "https://api.example.com"
    rate = "60/minute"
    burst = 5

    [stack]                       # the switches app.py takes as -c context (docs/options.md)
    metrics = false
    metadata_index = false
    keep_image_versions = 5

Every key is checked like the product's: an unknown one is an error naming the nearest known key.
``cdk synth`` takes ``[stack]``'s keys as context under their names, and ``[egress]``'s as
``-c egress.<key>`` (``budgets`` as a JSON list of tables): :meth:`FleetFile.with_egress`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, ClassVar, Mapping, Optional

from pydantic import Field, field_validator, model_validator

from .cloudwatch_limits import RETENTION_DAYS
from .errors import Problem, ProjectError
from .options import EgressOptions, Rule, ValidatedModel, _Options, rules_error, value_error

FLEET_FILE = "rayito-constructs.toml"


class StackOptions(_Options):
    """The ``[stack]`` table: the switches of ``app.py`` (``-c`` context wins over each)."""

    SECTION: ClassVar[str] = "stack"

    metrics: bool = False
    dashboard: Optional[bool] = None
    alarm_actions: tuple[str, ...] = ()
    log_retention: Optional[int] = Field(None, ge=0)
    saved_queries: bool = True
    keep_image_versions: Optional[int] = Field(5, ge=1, le=49)
    retain_vms_on_delete: bool = False
    metadata_index: bool = False
    keep_recipe: bool = False
    reconciler: Optional[bool] = None
    image_arn: Optional[str] = None
    base_artifact: Optional[str] = None
    base_artifact_sha256: Optional[str] = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    base_image: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    base_image_version: Optional[str] = None
    build_image: bool = True

    @property
    def builds_image(self) -> bool:
        """Whether these switches alone have the stack build the image (a ``rayd`` given, no
        image from elsewhere), as ``AgentFleet`` decides with them; ``-c`` context may add one."""
        return self.build_image and not self.image_arn and bool(self.base_artifact or self.base_image)

    @field_validator("log_retention")
    @classmethod
    def _retention(cls, value: Optional[int]) -> Optional[int]:
        """Days CloudWatch Logs offers (0: never expire), as ``-c log_retention`` takes them."""
        offered = sorted(v for v in RETENTION_DAYS.values() if v is not None)
        if value is not None and value != 0 and value not in offered:
            raise value_error(f"{value} is not a retention CloudWatch Logs offers: {', '.join(map(str, offered))} "
                              "days, or 0 for never expire")
        return value

    @model_validator(mode="after")
    def _one_base(self) -> "StackOptions":
        """``rayd`` from one place, as the context takes it: a release zip or a published base."""
        problems: list[Rule] = []
        if self.base_artifact and self.base_image:
            problems.append(("stack.base_image", "stack.base_artifact, stack.base_image: give one of them (a release "
                             "zip composed at synth, or the base published in the account, composed at deploy)",
                             ("stack.base_artifact",)))
        rayd = "base_artifact" if self.base_artifact else "base_image" if self.base_image else None
        if self.image_arn and rayd and self.build_image:
            problems.append(("stack.image_arn", f"stack.image_arn, stack.{rayd}: give one of them (an image published "
                             "elsewhere, or the one the stack builds)", (f"stack.{rayd}",)))
        if self.base_artifact_sha256 and not self.base_artifact:
            problems.append(("stack.base_artifact_sha256", "stack.base_artifact_sha256: give base_artifact with it", ()))
        if problems:
            raise rules_error(problems)
        return self


class FleetFile(ValidatedModel):
    """This library's settings of one fleet (``rayito-constructs.toml``; all optional)."""

    model_config = _Options.model_config

    egress: EgressOptions = EgressOptions()
    stack: StackOptions = StackOptions()

    def with_egress(self, values: Mapping[str, Any], *, typed: str = "-c ") -> "FleetFile":
        """These settings with ``[egress]`` keys set from elsewhere (``-c egress.<key>`` context):
        each key given replaces the file's (``budgets`` replaces every ``[[egress.budgets]]``), and
        the whole ``[egress]`` is checked again as the file is; a problem names the key as typed
        (``-c egress.default_burst: 0 is below the minimum of 1``)."""
        merged = {**{key: getattr(self.egress, key) for key in self.egress.model_fields_set}, **values}
        try:
            egress = FleetFile.model_validate({"egress": merged}).egress
        except ProjectError as exc:
            raise ProjectError([Problem(p.key, f"{typed}{p.message}", p.related) for p in exc.problems]) from None
        return FleetFile(egress=egress, stack=self.stack)

    @classmethod
    def read(cls, folder: Path) -> "FleetFile":
        """The folder's ``rayito-constructs.toml``, or the defaults when it has none."""
        path = folder / FLEET_FILE
        if not path.is_file():
            return cls()
        try:
            data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ProjectError([Problem(FLEET_FILE, f"{FLEET_FILE}: not valid TOML ({exc})")]) from None
        try:
            return cls.model_validate(data)
        except ProjectError as exc:
            raise ProjectError([Problem(p.key, f"{FLEET_FILE}: {p.message}", p.related) for p in exc.problems]) from None

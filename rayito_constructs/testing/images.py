"""MicroVM images and their versions, with the rules measured on the service (GT §7).

* Versions are numbered ``1.0``, ``2.0``...; every UpdateMicrovmImage builds a new one (the image
  is UPDATING meanwhile) [M 2026-09-15].
* A VM can start from a version that is SUCCESSFUL and ACTIVE; ``imageVersion`` defaults to the
  latest such. None: "No active version found for MicroVM image <ARN>", synchronously, no VM
  [M 2026-10-02].
* UpdateMicrovmImageVersion (``status``) answers ``ConflictException: MicroVM Image is already in
  state: UPDATING`` while the image is UPDATING [M 2026-09-15].
* DeleteMicrovmImageVersion works on an ACTIVE version; the image is UPDATING for about 5.4 s;
  a second delete meanwhile is a ConflictException; deleting a deleted version succeeds (model:
  idempotent) [M 2026-09-16, Q49].
* The last remaining version cannot be deleted on its own: ``ValidationException: This is the last
  version. Please delete the entire image`` [3rd, microvms.md §1].
* DeleteMicrovmImage: DELETING at once [M 2026-09-16].
* The first launches of a freshly published version are slow (26-65 s) [M 2026-10-07, Q146].
* ListMicrovmImageVersions items carry no ``environmentVariables``; GetMicrovmImageVersion does
  [M 2026-10-02, Q118].
* A version carries what its VMs run (:class:`ImageRuntime`): the product's base with ``rayd`` as
  PID 1, or not, and the app folder at ``/opt/agents/app`` (``vm_host.py`` runs them). Its hooks
  are the request's ``hooks``: RunMicrovm with a ``runHookPayload`` on a version whose run hook is
  not ENABLED is the measured 400 (``backend.py``).
"""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .exceptions import conflict, not_found, validation

#: Members of a version that come from the create/update request.
VERSION_MEMBERS = (
    "baseImageArn", "baseImageVersion", "buildRoleArn", "description", "codeArtifact", "logging",
    "egressNetworkConnectors", "cpuConfigurations", "resources", "additionalOsCapabilities", "hooks",
    "environmentVariables", "kmsKeyIdentifier",
)
PLACEHOLDER_REQUEST = {
    "baseImageArn": "arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1",
    "baseImageVersion": "1.0",
    "buildRoleArn": "arn:aws:iam::123456789012:role/emulator-build",
    "codeArtifact": {"uri": "s3://emulator/artifact.zip"},
}


@dataclass(frozen=True)
class ImageRuntime:
    """What a VM of an image version runs: ``rayd`` (the product's base: rayd as PID 1, what
    ``rayito image publish`` builds and every agent image inherits) or not (a Dockerfile on the
    managed base: nothing answers on the endpoint), and ``app_dir``, the folder the image has at
    ``/opt/agents/app`` (the agent project's source)."""

    rayd: bool = False
    app_dir: Optional[Path] = None


NO_RAYD = ImageRuntime()


def product_hooks() -> dict[str, Any]:
    """The hooks of the product's base, every one ENABLED, in the API's shape (the installed
    product's ``IMAGE_HOOKS``: port 9000, run/resume/suspend 30 s, terminate 10 s, ready and
    validate 600 s)."""
    from rayito._images_publish_domain import IMAGE_HOOKS

    return copy.deepcopy(IMAGE_HOOKS)


def _ts(seconds: Optional[float]) -> Optional[dt.datetime]:
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, dt.timezone.utc)


def version_number(version: str) -> float:
    try:
        return float(version)
    except ValueError:
        return -1.0


@dataclass
class ImageVersion:
    version: str
    created_at: float
    ready_at: float  # when the build ends
    request: dict[str, Any]
    memory_mib: int
    status: str = "ACTIVE"
    failed: bool = False
    fresh: bool = True  # its first launches are slow
    launches: int = 0
    deleting_at: Optional[float] = None
    deleted_at: Optional[float] = None
    updated_at: Optional[float] = None
    tags: dict[str, str] = field(default_factory=dict)
    runtime: ImageRuntime = NO_RAYD

    def state(self, now: float) -> str:
        if self.deleted_at is not None and now >= self.deleted_at:
            return "DELETED"
        if self.deleting_at is not None:
            return "DELETING"
        if now < self.ready_at:
            return "IN_PROGRESS"
        return "FAILED" if self.failed else "SUCCESSFUL"

    def runnable(self, now: float) -> bool:
        return self.state(now) == "SUCCESSFUL" and self.status == "ACTIVE"

    def view(self, image: "Image", now: float, *, full: bool) -> dict[str, Any]:
        data = {k: copy.deepcopy(self.request[k]) for k in VERSION_MEMBERS if k in self.request}
        if not full:
            data.pop("environmentVariables", None)  # [M 2026-10-02] only GetMicrovmImageVersion has them
        data.update(
            imageArn=image.arn,
            imageVersion=self.version,
            state=self.state(now),
            status=self.status,
            createdAt=_ts(self.created_at),
            updatedAt=_ts(self.updated_at),
        )
        if full and self.tags:
            data["tags"] = dict(self.tags)
        return {k: v for k, v in data.items() if v is not None}


@dataclass
class Image:
    name: str
    arn: str
    created_at: float
    versions: dict[str, ImageVersion] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    busy_until: float = 0.0  # UPDATING until then (a build or a version delete)
    busy_since_create: bool = True
    deleting_at: Optional[float] = None
    deleted_at: Optional[float] = None
    updated_at: Optional[float] = None

    # ---------------------------------------------------------------- reading

    def state(self, now: float) -> str:
        if self.deleting_at is not None:
            return "DELETED" if self.deleted_at is not None and now >= self.deleted_at else "DELETING"
        if now < self.busy_until:
            return "CREATING" if self.busy_since_create else "UPDATING"
        live = self.live_versions(now)
        if self.busy_since_create:
            return "CREATE_FAILED" if live and all(v.failed for v in live) else "CREATED"
        return "UPDATED"

    def gone(self, now: float) -> bool:
        return self.deleted_at is not None and now >= self.deleted_at

    def live_versions(self, now: float) -> list[ImageVersion]:
        return sorted(
            (v for v in self.versions.values() if v.state(now) != "DELETED"), key=lambda v: version_number(v.version)
        )

    def latest_active(self, now: float) -> Optional[ImageVersion]:
        runnable = [v for v in self.live_versions(now) if v.runnable(now)]
        return runnable[-1] if runnable else None

    def latest_failed(self, now: float) -> Optional[ImageVersion]:
        failed = [v for v in self.live_versions(now) if v.state(now) == "FAILED"]
        return failed[-1] if failed else None

    def next_version(self) -> str:
        numbers = [version_number(v) for v in self.versions]
        return f"{int(max(numbers, default=0)) + 1}.0"

    def view(self, now: float, *, full: bool) -> dict[str, Any]:
        active = self.latest_active(now)
        failed = self.latest_failed(now)
        data = {
            "imageArn": self.arn,
            "name": self.name,
            "state": self.state(now),
            "latestActiveImageVersion": active.version if active else None,
            "latestFailedImageVersion": failed.version if failed else None,
            "createdAt": _ts(self.created_at),
            "updatedAt": _ts(self.updated_at),
        }
        if full:
            data["tags"] = dict(self.tags) or None
        return {k: v for k, v in data.items() if v is not None}

    # ---------------------------------------------------------------- rules

    def version(self, name: str, now: float) -> ImageVersion:
        found = self.versions.get(name)
        if found is None or found.state(now) == "DELETED":
            raise not_found(f"MicroVM image version {name} of {self.arn} not found", "MicrovmImageVersion", f"{self.arn}:{name}")
        return found

    def ensure_idle(self, now: float) -> None:
        """A change while a build or a version delete is under way is a ConflictException."""
        state = self.state(now)
        if state in ("CREATING", "UPDATING", "DELETING"):
            raise conflict(f"MicroVM Image is already in state: {state}", "MicrovmImage", self.arn)

    def runnable_version(self, wanted: Optional[str], now: float) -> ImageVersion:
        """The version a RunMicrovm starts, or the measured error."""
        if self.deleting_at is None:
            if wanted is None:
                chosen = self.latest_active(now)
            else:
                found = self.versions.get(wanted)
                chosen = found if found is not None and found.runnable(now) else None
            if chosen is not None:
                return chosen
        suffix = f" {wanted}" if wanted else ""
        raise not_found(f"No active version{suffix} found for MicroVM image {self.arn}", "MicrovmImage", self.arn)

    def add_version(self, now: float, request: dict[str, Any], memory_mib: int, build_seconds: float,
                    *, fresh: bool = True, version: Optional[str] = None,
                    runtime: ImageRuntime = NO_RAYD) -> ImageVersion:
        name = version or self.next_version()
        made = ImageVersion(name, now, now + build_seconds, request, memory_mib, fresh=fresh, runtime=runtime)
        self.versions[name] = made
        self.updated_at = now
        return made

    def delete_version(self, name: str, now: float, seconds: float) -> ImageVersion:
        found = self.versions.get(name)
        if found is None:
            raise not_found(f"MicroVM image version {name} of {self.arn} not found", "MicrovmImageVersion", f"{self.arn}:{name}")
        if found.deleting_at is not None:
            return found  # idempotent (model): already deleting or deleted
        if not any(v is not found and v.deleting_at is None for v in self.versions.values()):
            # [3rd] microvms.md §1: the last remaining version cannot be deleted on its own (GT §7
            # only measured deleting a version of an image that kept others).
            raise validation("This is the last version. Please delete the entire image")
        self.ensure_idle(now)
        found.deleting_at, found.deleted_at = now, now + seconds
        self.busy_until, self.busy_since_create, self.updated_at = now + seconds, False, now
        return found

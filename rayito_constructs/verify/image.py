"""Image: the fleet's MicroVM image is CREATED or UPDATED with an ACTIVE, SUCCESSFUL version; the
version the reconciler runs (its ``IMAGE_VERSION``) is such a version and the newest one; the
managed base image version it was built on is not deprecated, expiring or recalled.

Base image versions go AVAILABLE -> DEPRECATED (60 days) -> EXPIRING (30 days) -> EXPIRED (will
not boot) or RECALLED (``rayito-ground-truth.md`` section 7, AWS documentation as quoted there).
"""

from __future__ import annotations

from typing import Any, Optional

from .aws import AwsError, unable
from .context import Context, version_key
from .report import Finding, fail, ok, warn

GOOD_IMAGE = ("CREATED", "UPDATED")
BUSY_IMAGE = ("CREATING", "UPDATING")


def usable(versions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ACTIVE and SUCCESSFUL versions, newest last."""
    good = [v for v in versions if v.get("status") == "ACTIVE" and v.get("state") == "SUCCESSFUL"]
    return sorted(good, key=lambda v: (version_key(v.get("imageVersion")), str(v.get("createdAt") or "")))


def check(ctx: Context) -> list[Finding]:
    arn = ctx.image_arn()
    if not arn:
        return [fail("image", "the stack names no MicroVM image (no ImageArn output, image resource or IMAGE_ARN)",
                     "deploy the fleet's stack completely, or pass image_arn to the fleet")]
    try:
        image = ctx.image()
    except AwsError as error:
        if error.kind == "not_found":
            return [fail("image", f"{arn} does not exist", "deploy the stack (it builds the image) or publish the "
                         "image the fleet names", image_arn=arn)]
        return [unable("image", error, f"read the image {arn}")]
    try:
        versions = ctx.image_versions()
    except AwsError as error:
        return [_image_state(arn, image, None), unable("image.version", error, f"list the versions of {arn}")]
    findings = [_image_state(arn, image, versions)]
    findings.append(_running_version(ctx, image, versions))
    findings.append(_base(ctx, image, versions))
    return findings


def _image_state(arn: str, image: dict[str, Any], versions: Optional[list[dict[str, Any]]]) -> Finding:
    state = image.get("state")
    latest = image.get("latestActiveImageVersion")
    data = {"image_arn": arn, "state": state, "latest_active": latest,
            "versions": [{k: v.get(k) for k in ("imageVersion", "state", "status", "stateReason")} for v in versions or []]}
    good = usable(versions or [])
    if state in GOOD_IMAGE and versions is not None and not good:
        failed = image.get("latestFailedImageVersion")
        reason = next((v.get("stateReason") for v in versions if v.get("imageVersion") == failed), None)
        return fail("image", f"{image.get('name')} is {state} but has no ACTIVE, SUCCESSFUL version"
                    + (f" (version {failed} failed: {reason})" if failed else ""),
                    "read the image build logs (/aws/lambda-microvms/<image name>), fix the build and deploy again", **data)
    if state in GOOD_IMAGE:
        counted = f" ({len(good)} usable of {len(versions)})" if versions is not None else " (versions not listed)"
        newest = latest or (good[-1].get("imageVersion") if good else "unknown")
        return ok("image", f"{image.get('name')} {state}, latest active version {newest}{counted}", **data)
    if state in BUSY_IMAGE:
        usable_note = f"; version {good[-1].get('imageVersion')} is usable meanwhile" if good else ""
        return warn("image", f"{image.get('name')} is {state} (a build is running, 2-5 minutes){usable_note}",
                    "wait for the build, then run verify again", **data)
    return fail("image", f"{image.get('name')} is {state}", "read the stack events and the image build logs, "
                "fix the cause and deploy again", **data)


def _running_version(ctx: Context, image: dict[str, Any], versions: list[dict[str, Any]]) -> Finding:
    env = ctx.reconciler_env()
    running = env.get("IMAGE_VERSION")
    good = usable(versions)
    newest = image.get("latestActiveImageVersion") or (good[-1].get("imageVersion") if good else None)
    recipe_version = ((ctx.recipe_doc() or {}).get("image") or {}).get("version")
    data = {"reconciler_image_version": running, "latest_active": newest, "recipe_image_version": recipe_version}
    if not ctx.fleet.reconciler_function:
        return warn("image.version", f"no reconciler deployed; new VMs run the latest active version {newest}",
                    "nothing to do unless the fleet should have a reconciler (reconciler=True)", **data)
    if not env:
        return warn("image.version", "the reconciler's IMAGE_VERSION could not be read",
                    "see the reconciler check", **data)
    if not running:
        return warn("image.version", f"the reconciler pins no image version; new VMs run the latest active one ({newest})",
                    "nothing to do unless the fleet should roll onto its image's versions (a fleet built by the stack does)",
                    **data)
    match = next((v for v in versions if v.get("imageVersion") == running), None)
    if match is None:
        return fail("image.version", f"the reconciler runs version {running}, which the image does not have",
                    "deploy the stack again so the reconciler gets the image's current version", **data)
    if match.get("status") != "ACTIVE" or match.get("state") != "SUCCESSFUL":
        return fail("image.version", f"the reconciler runs version {running}, which is {match.get('state')}/"
                    f"{match.get('status')}: RunMicrovm refuses it", "activate a good version "
                    "(UpdateMicrovmImageVersion status ACTIVE) or deploy again", **data)
    if recipe_version not in (None, running) and "${Token" not in str(recipe_version):
        return warn("image.version", f"the reconciler runs {running} but the recipe says {recipe_version}: clients "
                    "that connect by name start the other one", "deploy the stack again so both are rewritten", **data)
    if newest and running != newest:
        return warn("image.version", f"the reconciler runs {running}; a newer active version {newest} exists",
                    "deploy the stack again to roll the fleet onto it", **data)
    return ok("image.version", f"the reconciler runs {running}, the latest active version", **data)


def _same_version(a: Any, b: Any) -> bool:
    """``"1"`` and ``"1.0"`` are one version (create takes the major, update echoes ``1.0``)."""
    if a is None or b is None:
        return False
    pa, pb = str(a).split("."), str(b).split(".")
    if pa == pb:
        return True
    short, long_ = (pa, pb) if len(pa) < len(pb) else (pb, pa)
    return long_[: len(short)] == short and all(p in ("0", "") for p in long_[len(short):])


def _base(ctx: Context, image: dict[str, Any], versions: list[dict[str, Any]]) -> Finding:
    running = ctx.reconciler_env().get("IMAGE_VERSION") or image.get("latestActiveImageVersion")
    version = next((v for v in versions if v.get("imageVersion") == running), None) or (usable(versions) or [None])[-1]
    if version is None:
        return warn("image.base", "no usable image version to read the base image from", "see the image check")
    base_arn, base_version = version.get("baseImageArn"), version.get("baseImageVersion")
    data = {"base_image_arn": base_arn, "base_image_version": base_version, "image_version": version.get("imageVersion")}
    if not base_arn:
        return warn("image.base", "the image version names no base image", "check the image by hand", **data)
    try:
        managed = [item for page in ctx.clients.pages("lambda-microvms", "list_managed_microvm_image_versions",
                                                       imageIdentifier=base_arn) for item in page.get("items", [])]
    except AwsError as error:
        return unable("image.base", error, f"list the versions of the base image {base_arn}")
    data["managed_versions"] = [{"version": m.get("imageVersion"), "status": m.get("status")} for m in managed]
    match = next((m for m in managed if _same_version(m.get("imageVersion"), base_version)), None)
    name = f"{base_arn.rsplit(':', 1)[-1]} version {base_version}"
    if match is None:
        return warn("image.base", f"base image {name} is not among its managed versions "
                    f"({', '.join(str(m.get('imageVersion')) for m in managed) or 'none listed'})",
                    "set base_image_version to a listed version and deploy again", **data)
    status = str(match.get("status") or "UNKNOWN")
    newer = [str(m.get("imageVersion")) for m in managed if m.get("status") == "AVAILABLE"
             and version_key(m.get("imageVersion")) > version_key(match.get("imageVersion"))]
    move = f"set base_image_version to {newer[-1]} and deploy again" if newer else "move to an AVAILABLE base version"
    data["status"] = status
    if status == "AVAILABLE":
        return ok("image.base", f"base image {name} is AVAILABLE", **data)
    if status == "DEPRECATED":
        return warn("image.base", f"base image {name} is DEPRECATED (EXPIRING within about 60 days, then it will not boot)",
                    move, **data)
    if status in ("EXPIRING", "EXPIRED", "RECALLED"):
        return fail("image.base", f"base image {name} is {status}"
                    + (" (within about 30 days VMs will not boot)" if status == "EXPIRING" else ""), move, **data)
    return warn("image.base", f"base image {name} has status {status}", move, **data)

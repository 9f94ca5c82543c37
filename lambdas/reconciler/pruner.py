"""Image pruning: ``keep_image_versions`` of an image's versions are kept, older ones are deleted,
oldest first, one at a time (docs/image.md "Old versions").

One function per image (``rayito_constructs.image_pruner.ImagePruner``), deployed from the
reconciler's package (the bundled ``lambda-microvms`` model). It runs

* **before each build**: ``Custom::RayitoImagePruner``, which the image depends on. Its
  ``ImageDigest`` property changes whenever the image's properties do, that is whenever the
  deploy builds a new version: it then keeps ``keep - 1`` versions, so the image holds ``keep``
  after the build, and an image at the quota of 50 has room for the new one. It waits until the
  image is idle again before answering (a version delete leaves it UPDATING about 5.4 s, and the
  image's update would fail with a ConflictException meanwhile). It never fails a deploy: what it
  could not do is in the answer's ``Data`` and the log, and the schedule finishes it.
* **on a schedule** (hourly by default): what a deploy left (versions whose VMs have ended since).

The rules, every run:

* the newest ``keep`` versions are kept, and so are the image's ``latestActiveImageVersion`` (what
  the fleet runs and what new VMs start from: a fleet rolls to it), versions still building, and
  **any version with a live VM** (PENDING, RUNNING, SUSPENDING, SUSPENDED or TERMINATING: a
  client's VM counts as much as the fleet's; a TERMINATED one lingering in lists does not);
* nothing is deleted while the image is CREATING, UPDATING or DELETING (a build, another delete);
* a version to delete is first made INACTIVE (no new VM can start from it), then, after
  ``SETTLE_SECONDS`` (lists are eventually consistent), ListMicrovms filtered by that version is
  asked again: a VM there keeps the version (made ACTIVE again). Only then is it deleted. One the
  run had no time left for stays INACTIVE, and the next run deletes it;
* **one delete at a time** (measured: chained deletes conflict; the image is UPDATING about
  5.4 s after each): the next waits until the image is idle, polling GetMicrovmImage with a
  growing interval, never in a hot loop. A ConflictException waits the same way, at most
  ``MAX_CONFLICTS`` times per version.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from botocore.exceptions import BotoCoreError, ClientError

from .aws import MICROVMS_CONFIG, session
from .custom_resource import BadRequest, check_identity, emit, error_code, log, remaining_seconds, respond, response_url_ok

RESOURCE_TYPE = "Custom::RayitoImagePruner"
NAMESPACE = "Rayito/Fleet"
SERVICE = "rayito-image-pruner"
#: States of a VM that keep its version.
HOLDING = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED", "TERMINATING")
BUSY = ("CREATING", "UPDATING", "DELETING")
BUILDING = ("PENDING", "IN_PROGRESS")
GOING = ("DELETING", "DELETED")
#: Seconds between making versions INACTIVE and listing their VMs again (measured consistency of
#: reads: about 0.5 s).
SETTLE_SECONDS = 5.0
MAX_CONFLICTS = 3
IDLE_POLL_FIRST_SECONDS = 1.0
IDLE_POLL_MAX_SECONDS = 8.0
#: Measured: after a version delete the image is UPDATING for about 5.4 s (ground truth section
#: 7): the next look comes then, not before.
VERSION_DELETE_SECONDS = 5.5
#: Seconds a deploy may spend pruning before it answers (the schedule finishes the rest): 46
#: deletes (an image at the quota of 50, keeping 4 before a build) take about 4.5 minutes.
DEPLOY_BUDGET_SECONDS = 480.0
#: Kept back from a run's time after its last delete, to see the image idle before answering.
FINAL_WAIT_SECONDS = 20.0
RESERVE_SECONDS = 15.0
MAX_LISTED = 10

CLOCK = time.time
SLEEP = time.sleep


def _now() -> float:
    return CLOCK()


def _sleep(seconds: float) -> None:
    # uncovered: every caller passes a positive wait (wait_idle checks ahead > 0; polls start above 0)
    if seconds > 0:
        SLEEP(seconds)


_CLIENT: Any = None


def client() -> Any:
    """The production client: one attempt per call (this code decides every retry)."""
    return session().client("lambda-microvms", config=MICROVMS_CONFIG)


def _number(version: str) -> float:
    try:
        return float(version)
    # uncovered: a version name float() refuses; the service (and the emulator) number versions 1, 2, 3...
    except (TypeError, ValueError):
        return -1.0


@dataclass
class Pruner:
    """One pass over one image, within ``deadline`` (on :data:`CLOCK`)."""

    microvms: Any
    image_arn: str
    keep: int
    deadline: float
    settle_seconds: float = SETTLE_SECONDS
    deleted: list[str] = field(default_factory=list)
    held: dict[str, int] = field(default_factory=dict)  # version -> live VMs seen on it
    skipped: dict[str, str] = field(default_factory=dict)  # version -> why it was not deleted
    calls: dict[str, int] = field(default_factory=dict)
    versions_before: int = 0
    latest_active: Optional[str] = None
    outcome: str = "nothing_to_prune"
    busy_until: float = float("-inf")  # when our last delete should have let the image go

    def _call(self, method: str, **kwargs: Any) -> Any:
        name = "".join(part.title() for part in method.split("_"))
        self.calls[name] = self.calls.get(name, 0) + 1
        while True:
            try:
                return getattr(self.microvms, method)(**kwargs)
            except ClientError as exc:
                if error_code(exc) != "ThrottlingException":
                    raise
                wait = float(exc.response.get("retryAfterSeconds") or 1.0)
                if _now() + wait >= self.deadline:
                    raise
                _sleep(wait)
                self.calls[name] += 1

    def _left(self) -> float:
        return self.deadline - _now()

    # -------------------------------------------------------------- reading

    def image_state(self) -> Optional[dict[str, Any]]:
        try:
            state: dict[str, Any] = self._call("get_microvm_image", imageIdentifier=self.image_arn)
            return state
        except ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return None
            raise

    def wait_idle(self) -> bool:
        """Until the image is neither building nor deleting a version (bounded, growing polls;
        after our own delete, the first look comes when it should be over)."""
        poll = IDLE_POLL_FIRST_SECONDS
        ahead = self.busy_until - _now()
        if ahead > 0:
            # uncovered: our own delete still settling with less time left than it takes: needs a deadline within VERSION_DELETE_SECONDS of a delete
            if self._left() <= ahead:
                return False
            _sleep(ahead)
        while True:
            image = self.image_state()
            if image is None:
                return False
            self.latest_active = image.get("latestActiveImageVersion") or self.latest_active
            if image.get("state") not in BUSY:
                return True
            if self._left() <= poll:
                return False
            _sleep(poll)
            poll = min(IDLE_POLL_MAX_SECONDS, poll * 2)

    def versions(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        token: Optional[str] = None
        while True:
            kwargs: dict[str, Any] = {"imageIdentifier": self.image_arn, "maxResults": 50}
            # uncovered: a second page needs more than 50 versions of one image; no test builds that many
            if token:
                kwargs["nextToken"] = token
            page = self._call("list_microvm_image_versions", **kwargs)
            out += page.get("items") or []
            token = page.get("nextToken")
            # uncovered: the same second page (more than 50 versions)
            if not token:
                return out

    def live_vms(self, version: Optional[str] = None) -> dict[str, int]:
        """Live VMs of the image per version (of one version when given), every page."""
        counts: dict[str, int] = {}
        token: Optional[str] = None
        while True:
            kwargs: dict[str, Any] = {"imageIdentifier": self.image_arn, "maxResults": 50}
            if version:
                kwargs["imageVersion"] = version
            if token:
                kwargs["nextToken"] = token
            page = self._call("list_microvms", **kwargs)
            for item in page.get("items") or []:
                if item.get("state") in HOLDING:
                    key = str(item.get("imageVersion") or "")
                    counts[key] = counts.get(key, 0) + 1
            token = page.get("nextToken")
            if not token:
                return counts

    # -------------------------------------------------------------- deciding

    def plan(self, versions: list[dict[str, Any]], live: Mapping[str, int], keep: int) -> list[dict[str, Any]]:
        """The versions to delete, oldest first: outside the newest ``keep``, not the latest
        active one, not building, no live VM."""
        counted = sorted((v for v in versions if v.get("state") not in GOING), key=lambda v: _number(v["imageVersion"]))
        newest = {v["imageVersion"] for v in counted[-keep:]} if keep > 0 else set()
        out = []
        for v in counted:
            name = v["imageVersion"]
            if name in newest:
                continue
            if name == self.latest_active:
                self.skipped[name] = "latest_active"
            # uncovered: an older version still building while a newer one is active; the emulator builds one version at a time
            elif v.get("state") in BUILDING:
                self.skipped[name] = "building"
            elif live.get(name):
                self.held[name] = live[name]
            else:
                out.append(v)
        return out

    # -------------------------------------------------------------- acting

    def _set_status(self, version: str, status: str) -> bool:
        for _ in range(MAX_CONFLICTS):
            try:
                self._call("update_microvm_image_version", imageIdentifier=self.image_arn, imageVersion=version,
                           status=status)
                return True
            except ClientError as exc:
                if error_code(exc) != "ConflictException" or not self.wait_idle():
                    self.skipped[version] = f"status_{status.lower()}:{error_code(exc)}"
                    return False
        self.skipped[version] = f"status_{status.lower()}:conflicts"
        return False

    def _delete(self, version: str) -> bool:
        for _ in range(MAX_CONFLICTS):
            # uncovered: the image stays busy (building or deleting) until the pass's deadline; needs a build longer than the deadline
            if not self.wait_idle():
                self.skipped[version] = "image_busy"
                return False
            try:
                self._call("delete_microvm_image_version", imageIdentifier=self.image_arn, imageVersion=version)
                self.busy_until = _now() + VERSION_DELETE_SECONDS
                return True
            except ClientError as exc:
                code = error_code(exc)
                # uncovered: a version deleted by someone else between our list and our delete (404); no test races a second deleter
                if code == "ResourceNotFoundException":
                    return True  # already gone
                if code != "ConflictException":
                    self.skipped[version] = f"delete:{code}"
                    return False
        self.skipped[version] = "delete:conflicts"
        return False

    def run(self) -> str:
        """Prune to ``keep`` versions; the outcome word."""
        keep = self.keep
        if not self.wait_idle():
            if self.image_state() is None:
                self.outcome = "no_image"
            else:
                self.outcome = "image_busy"
            return self.outcome
        versions = self.versions()
        self.versions_before = sum(1 for v in versions if v.get("state") not in GOING)
        live = self.live_vms()
        doomed = self.plan(versions, live, keep)
        if not doomed:
            self.outcome = "nothing_to_prune"
            return self.outcome
        inactive: list[str] = []
        ready: list[str] = []
        for v in doomed:
            name = v["imageVersion"]
            if self._left() <= 0:
                self.skipped.setdefault(name, "out_of_time")
                continue
            if v.get("status", "ACTIVE") == "ACTIVE":
                if not self._set_status(name, "INACTIVE"):
                    continue
                inactive.append(name)
            ready.append(name)
        if inactive:
            _sleep(min(self.settle_seconds, max(0.0, self._left())))
        for name in ready:
            if self._left() <= FINAL_WAIT_SECONDS + VERSION_DELETE_SECONDS:
                # No delete that the time left could not see through (the image idle again).
                # Left INACTIVE: beyond keep, the next run deletes it (no new VM can start from it).
                self.skipped.setdefault(name, "out_of_time")
                continue
            late = self.live_vms(name).get(name, 0)
            if late:
                # A VM started before the version went INACTIVE and was listed late: keep it.
                self.held[name] = late
                if name in inactive:
                    self._set_status(name, "ACTIVE")
                continue
            if self._delete(name):
                self.deleted.append(name)
        self.wait_idle()  # a deploy's update of the image right after must not meet UPDATING
        self.outcome = "pruned" if self.deleted else "nothing_pruned"
        return self.outcome

    def report(self) -> dict[str, Any]:
        return {
            "Outcome": self.outcome,
            "Keep": self.keep,
            "VersionsBefore": self.versions_before,
            "Deleted": len(self.deleted),
            "DeletedVersions": ",".join(self.deleted[:MAX_LISTED]),
            "Held": ",".join(f"{v}:{n}" for v, n in sorted(self.held.items())[:MAX_LISTED]),
            "Skipped": ",".join(f"{v}:{why}" for v, why in sorted(self.skipped.items())[:MAX_LISTED]),
            "LatestActive": self.latest_active or "",
        }


def _keep(env: Mapping[str, str]) -> int:
    keep = int(env.get("KEEP_VERSIONS") or 5)
    if not 1 <= keep <= 49:
        raise ValueError(f"KEEP_VERSIONS: {keep} is not within 1 to 49")
    return keep


def prune(env: Mapping[str, str], microvms: Any, keep: int, budget: float) -> dict[str, Any]:
    """One pass keeping ``keep`` versions; its report (never raises on a service error)."""
    pruner = Pruner(microvms=microvms, image_arn=env["IMAGE_ARN"], keep=keep, deadline=_now() + max(0.0, budget),
                    settle_seconds=float(env.get("SETTLE_SECONDS") or SETTLE_SECONDS))
    started = _now()
    try:
        pruner.run()
    except (ClientError, BotoCoreError) as exc:
        pruner.outcome = f"error:{error_code(exc)}"
    report = pruner.report()
    name = env["IMAGE_ARN"].rsplit(":microvm-image:", 1)[-1]
    emit(NAMESPACE, {"image": name}, {
        "ImageVersionsDeleted": (float(len(pruner.deleted)), "Count"),
        "ImageVersionsHeld": (float(len(pruner.held)), "Count"),
        "ImageVersions": (float(max(0, pruner.versions_before - len(pruner.deleted))), "Count"),
    }, {"service": SERVICE, "event": "image_pruned", "calls": pruner.calls, "seconds": round(_now() - started, 3),
        **{k: v for k, v in report.items()}})
    return report


def handler(event: Mapping[str, Any], context: Any) -> Optional[dict[str, Any]]:
    """Lambda entry point: CloudFormation's requests (before each build) and the schedule's."""
    global _CLIENT
    env = os.environ
    # uncovered: a warm start (second invocation in one process, client cached); each test invocation starts fresh
    if _CLIENT is None:
        _CLIENT = client()
    if not (isinstance(event, Mapping) and "RequestType" in event):
        keep = _keep(env)
        return prune(env, _CLIENT, keep, remaining_seconds(context) - RESERVE_SECONDS)
    url = str(event.get("ResponseURL", ""))
    if not response_url_ok(url, env.get("AWS_REGION", "")):
        log({"event": "refused", "service": SERVICE, "reason": "ResponseURL is not CloudFormation's response endpoint"})
        return None
    kind = str(event.get("RequestType"))
    physical = f"rayito-pruner:{env.get('IMAGE_ARN', '')}"
    try:
        named = check_identity(event, context, env, RESOURCE_TYPE)
        if named != env.get("IMAGE_NAME"):
            raise BadRequest("the resource is not this function's image")
    except (BadRequest, ValueError) as exc:
        log({"event": "refused", "service": SERVICE, "reason": str(exc), "action": kind})
        respond(event, "FAILED", str(event.get("PhysicalResourceId") or physical), {}, f"refused: {exc}")
        return None
    if kind == "Delete":
        respond(event, "SUCCESS", str(event.get("PhysicalResourceId") or physical), {"Outcome": "nothing"},
                "pruning ends with its resource")
        return None
    props = event.get("ResourceProperties") or {}
    old = event.get("OldResourceProperties") or {}
    keep = _keep(env)
    # A new version follows when the image's properties change: keep room for it.
    builds = kind == "Update" and props.get("ImageDigest") != old.get("ImageDigest")
    target = max(0, keep - 1) if builds else keep
    budget = min(float(env.get("DEPLOY_BUDGET_SECONDS") or DEPLOY_BUDGET_SECONDS),
                 remaining_seconds(context) - RESERVE_SECONDS)
    report = prune(env, _CLIENT, target, budget)
    report["Target"] = target
    # Never fails a deploy: what it could not do is in Data, the log, and the next scheduled run.
    respond(event, "SUCCESS", physical, report, f"{report['Outcome']}: {report['Deleted']} version(s) deleted")
    return None


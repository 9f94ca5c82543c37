"""Account, region and stack: can verify see the account, does the region offer Lambda MicroVMs,
is the stack deployed and whole."""

from __future__ import annotations

from typing import Optional

from .aws import AwsError, Clients, unable
from .deployed import MICROVM_REGIONS, REGIONS_AS_OF, DeployedStack
from .report import Finding, fail, ok, warn

_FAILED_STACK = ("CREATE_FAILED", "ROLLBACK_IN_PROGRESS", "ROLLBACK_FAILED", "ROLLBACK_COMPLETE", "DELETE_IN_PROGRESS",
                 "DELETE_FAILED", "UPDATE_FAILED", "UPDATE_ROLLBACK_FAILED", "IMPORT_ROLLBACK_FAILED",
                 "IMPORT_ROLLBACK_COMPLETE")


def identity(clients: Clients) -> tuple[Finding, Optional[dict]]:
    """STS GetCallerIdentity: do the credentials work, and whose are they."""
    try:
        who = clients.call("sts", "get_caller_identity")
    except AwsError as error:
        return unable("account", error, "read the caller identity (sts:GetCallerIdentity)"), None
    return ok("account", f"credentials work: account {who.get('Account')} as {who.get('Arn')}",
              account=who.get("Account"), arn=who.get("Arn")), who


def region(clients: Clients) -> Finding:
    """The region is in the list of MicroVM regions; off the list, a read of the MicroVMs API says
    whether the list is out of date (WARN) or the region really lacks the service (FAIL)."""
    name = clients.region
    if name in MICROVM_REGIONS:
        return ok("region", f"{name} offers Lambda MicroVMs (since {MICROVM_REGIONS[name]})", region=name)
    offered = ", ".join(MICROVM_REGIONS)
    try:
        clients.call("lambda-microvms", "list_microvm_images", maxResults=1)
    except AwsError as error:
        if error.kind in ("denied", "throttled"):
            return warn("region", f"{name} is not in the MicroVM regions known on {REGIONS_AS_OF}, and the API "
                        f"could not be asked ({error.code})", f"deploy in one of {offered}", region=name)
        return fail("region", f"{name} does not offer Lambda MicroVMs ({error.code})",
                    f"deploy the fleet in one of {offered}", region=name, error=error.code)
    return warn("region", f"{name} answers the MicroVMs API but is not in the regions known on {REGIONS_AS_OF}",
                "nothing to do if the fleet works; the list in verify is out of date", region=name)


def stack_status(stack: DeployedStack) -> Finding:
    """The stack's status and any resource that failed."""
    data = {"stack": stack.name, "status": stack.status, "reason": stack.status_reason,
            "resources": len(stack.resources), "outputs": stack.outputs}
    if stack.resources_error is not None:
        return unable("stack", stack.resources_error, f"list the resources of {stack.name}")
    failed = [r for r in stack.resources if r.status.endswith("_FAILED")]
    if failed:
        data["failed_resources"] = [{"logical_id": r.logical_id, "type": r.type, "status": r.status,
                                     "reason": r.reason} for r in failed]
    where = f"{stack.name} {stack.status}, {len(stack.resources)} resources"
    reason = f": {stack.status_reason}" if stack.status_reason else ""
    if stack.status in _FAILED_STACK:
        first = f"; first failed: {failed[0].logical_id} ({failed[0].reason})" if failed else ""
        return fail("stack", f"{where}{reason}{first}", "read the stack events, fix the cause and deploy again", **data)
    if stack.status.endswith("_IN_PROGRESS"):
        return warn("stack", f"{where}: an operation is in progress; what is not there yet is reported as not deployed",
                    "wait for the deploy to finish, then run verify again", **data)
    if stack.status == "UPDATE_ROLLBACK_COMPLETE":
        return warn("stack", f"{where}: the last update failed and was rolled back{reason}",
                    "read the stack events of the last update, fix the cause and deploy again", **data)
    if failed:
        return fail("stack", f"{where}; failed: {', '.join(r.logical_id for r in failed)}",
                    "read the stack events, fix the cause and deploy again", **data)
    return ok("stack", where, **data)

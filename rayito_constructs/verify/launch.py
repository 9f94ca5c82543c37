"""``--launch``: one real MicroVM from the fleet's image, with the launcher's permissions when a
role is given (the role assumed with SandboxLauncherPolicy as its session policy, so the session can
do no more than the policy allows), else with the caller's own credentials; wait until its endpoint
answers, always terminate it, report the timings. The only calls of verify that change anything.

Cost: billed per second while RUNNING at the measured us-east-1 ARM prices
(``rayito-ground-truth.md`` section 8: $0.0000276944 per vCPU-second and $0.0000036667 per
GB-second; one vCPU per 2,048 MiB of baseline memory, so 2 GB is about $0.126 an hour).
"""

from __future__ import annotations

import signal
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import boto3

from .aws import AwsError, Clients
from .context import Context
from .report import Finding, fail, ok

VCPU_SECOND_USD = 0.0000276944
GB_SECOND_USD = 0.0000036667
PRICES_FROM = "us-east-1 ARM list prices (rayito-ground-truth.md section 8)"
DEFAULT_TIMEOUT_SECONDS = 180
#: The VM's own limit: if verify dies before terminating it, the service ends it by then.
MAX_LIFETIME_SECONDS = 600
#: The proxy's default target port (``shared/research/microvms.md`` section 7).
APP_PORT = 8080
NOT_READY = (502, 503, 504)
POLL_SECONDS = 1.0

Probe = Callable[[str, dict[str, str]], Optional[int]]


def hourly_usd(memory_mib: int) -> float:
    return (memory_mib / 2048) * VCPU_SECOND_USD * 3600 + (memory_mib / 1024) * GB_SECOND_USD * 3600


def cost_line(memory_mib: Optional[int], timeout: float) -> str:
    memory = memory_mib or 2048
    hourly = hourly_usd(memory)
    most = hourly * (timeout + 30) / 3600
    guess = "" if memory_mib else " (memory unknown: priced as 2048 MiB)"
    return (f"launch: one {memory} MiB MicroVM for at most {timeout:g} s, then terminated: at most "
            f"${most:.4f} (${hourly:.3f}/hour while RUNNING, {PRICES_FROM}){guess}")


def http_probe(endpoint: str, headers: dict[str, str], *, timeout: float = 5.0, path: str = "/ping",
               url: Optional[str] = None) -> Optional[int]:
    """GET the VM's endpoint (a bare hostname: ``https://`` is added); the HTTP status, or None when
    nothing answered."""
    host = endpoint.split("://", 1)[-1].rstrip("/")
    request = urllib.request.Request(url or f"https://{host}{path}", headers=headers, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (the VM's endpoint)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ssl.SSLError, ValueError):
        return None


@dataclass
class Launch:
    microvm_id: Optional[str] = None
    endpoint: Optional[str] = None
    timings: dict[str, float] = field(default_factory=dict)
    states: list[str] = field(default_factory=list)
    statuses: list[Optional[int]] = field(default_factory=list)
    terminated: bool = False
    reason: Optional[str] = None


def launch_clients(ctx: Context, role_arn: Optional[str]) -> tuple[Clients, str]:
    """The clients the launch uses and a sentence saying whose permissions they carry."""
    if not role_arn:
        who = ctx.caller_arn or "unknown"
        return ctx.clients, (f"launch: with your own credentials ({who}), not the launcher's; pass --launch-role "
                             "<role ARN> to launch with SandboxLauncherPolicy only")
    policy = ctx.fleet.policy_arn("SandboxLauncherPolicy")
    params: dict[str, Any] = {"RoleArn": role_arn, "RoleSessionName": "rayito-verify-launch", "DurationSeconds": 900}
    if policy:
        params["PolicyArns"] = [{"arn": policy}]
    creds = ctx.clients.call("sts", "assume_role", **params)["Credentials"]
    session = boto3.Session(aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
                            aws_session_token=creds["SessionToken"], region_name=ctx.region)
    scope = "limited to SandboxLauncherPolicy by a session policy" if policy else "(SandboxLauncherPolicy not found)"
    return Clients(session, ctx.region, ctx.clients.attempts), f"launch: as {role_arn}, {scope}"


def check(ctx: Context, *, role_arn: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT_SECONDS,
          probe: Optional[Probe] = None) -> Finding:
    image = ctx.image_arn()
    if not image:
        return fail("launch", "not launched: the fleet's image is unknown", "see the image check")
    try:
        clients, who = launch_clients(ctx, role_arn)
    except AwsError as error:
        return fail("launch", f"not launched: could not assume {role_arn} ({error.code}: {error.message})",
                    "let the caller assume the role (its trust policy) or leave --launch-role out")
    env = ctx.reconciler_env()
    params: dict[str, Any] = {"imageIdentifier": image, "maximumDurationInSeconds": MAX_LIFETIME_SECONDS,
                              "clientToken": f"rayito-verify-{uuid.uuid4().hex}"}
    if env.get("IMAGE_VERSION"):
        params["imageVersion"] = env["IMAGE_VERSION"]
    role = ctx.execution_role_arn()
    if role:
        params["executionRoleArn"] = role
    result = run(clients, params, timeout=timeout, probe=probe or http_probe, clock=time.monotonic, sleep=ctx.sleep)
    data = {"microvm_id": result.microvm_id, "endpoint": result.endpoint, "timings": result.timings,
            "states": result.states[-5:], "credentials": who, "image_version": params.get("imageVersion"),
            "last_status": result.statuses[-1] if result.statuses else None}
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items())
    if result.microvm_id and not result.terminated:
        return fail("launch", f"{result.microvm_id} could not be terminated ({result.reason}); it ends by itself within "
                    f"{MAX_LIFETIME_SECONDS} s", f"terminate it now: aws lambda-microvms terminate-microvm "
                    f"--microvm-identifier {result.microvm_id}", **data)
    if "answered" in result.timings:
        return ok("launch", f"{result.microvm_id} answered on {result.endpoint}: {timings}; terminated", **data)
    if result.microvm_id is None:
        return fail("launch", f"RunMicrovm failed: {result.reason}",
                    "see the IAM, image and quotas findings; the error names what is missing", **data)
    return fail("launch", f"{result.microvm_id} never answered within {timeout:g} s: {result.reason or 'no answer'}"
                f"; {timings}; terminated", "read the VM's log (/aws/lambda-microvms/<image name>); the first launches "
                "of a new image version took 26-65 s when measured: try --launch-timeout 300", **data)


def run(clients: Clients, params: dict[str, Any], *, timeout: float, probe: Probe,
        clock: Callable[[], float], sleep: Callable[[float], None]) -> Launch:
    """RunMicrovm, wait for an answer from the endpoint, TerminateMicrovm in a ``finally`` (a
    SIGTERM meanwhile is turned into an exception so that the ``finally`` runs too)."""
    previous = _on_sigterm()
    try:
        return _run(clients, params, timeout=timeout, probe=probe, clock=clock, sleep=sleep)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _on_sigterm() -> Any:
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return None

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


def _run(clients: Clients, params: dict[str, Any], *, timeout: float, probe: Probe,
         clock: Callable[[], float], sleep: Callable[[float], None]) -> Launch:
    out = Launch()
    start = clock()
    try:
        try:
            vm = clients.call("lambda-microvms", "run_microvm", **params)
        except AwsError as error:
            out.reason = f"{error.code}: {error.message}"
            return out
        out.timings["run_call"] = clock() - start
        out.microvm_id, out.endpoint = vm["microvmId"], vm.get("endpoint")
        out.states.append(vm.get("state", ""))
        token: Optional[str] = None
        while clock() - start < timeout:
            try:
                got = clients.call("lambda-microvms", "get_microvm", microvmIdentifier=out.microvm_id)
            except AwsError as error:
                got = {"state": f"unknown ({error.code})"}
            state = got.get("state", "")
            out.endpoint = got.get("endpoint") or out.endpoint
            if not out.states or out.states[-1] != state:
                out.states.append(state)
            if state == "RUNNING" and "running" not in out.timings:
                out.timings["running"] = clock() - start
            if state in ("TERMINATING", "TERMINATED"):
                out.reason = f"the VM ended: {got.get('stateReason') or state}"
                return out
            if token is None:
                try:
                    token = clients.call("lambda-microvms", "create_microvm_auth_token", microvmIdentifier=out.microvm_id,
                                         expirationInMinutes=5, allowedPorts=[{"port": APP_PORT}])["authToken"].get(
                                             "X-aws-proxy-auth")
                except AwsError as error:
                    if error.kind == "denied":
                        out.reason = f"{error.code} on {error.action}"
                        return out
            if token is not None and out.endpoint:
                status = probe(out.endpoint, {"X-aws-proxy-auth": token})
                out.statuses.append(status)
                if status is not None and status not in NOT_READY:
                    out.timings["answered"] = clock() - start
                    return out
            sleep(POLL_SECONDS)
        return out
    finally:
        if out.microvm_id:
            began = clock()
            try:
                clients.call("lambda-microvms", "terminate_microvm", microvmIdentifier=out.microvm_id)
                out.terminated = True
                out.timings["terminate_call"] = clock() - began
            except AwsError as error:
                out.reason = f"terminate failed: {error.code}: {error.message}"
        out.timings["total"] = clock() - start

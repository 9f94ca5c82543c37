"""The MicroVM lifecycle as measured on the service (GT = shared/research/rayito-ground-truth.md),
through real boto3 clients over HTTP."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from rayito_constructs.testing import MicrovmsEmulator, VirtualClock, measured

from ..emulator_helpers import microvms_client
from .helpers import ROLE, error, get, run, state


def test_run_get_list(client, image, clock) -> None:
    vm = run(client, image, executionRoleArn=ROLE, maximumDurationInSeconds=3600)
    assert re.fullmatch(r"microvm-[0-9a-f-]{36}", vm["microvmId"])
    assert vm["state"] == "PENDING" and vm["imageArn"] == image and vm["imageVersion"] == "1.0"
    assert vm["maximumDurationInSeconds"] == 3600 and vm["executionRoleArn"] == ROLE
    assert vm["startedAt"] == dt.datetime.fromtimestamp(clock.now(), dt.timezone.utc)
    assert vm["ingressNetworkConnectors"][0].endswith(":aws-network-connector:HTTP_INGRESS")
    listed = client.list_microvms(imageIdentifier=image)
    assert [i["microvmId"] for i in listed["items"]] == [vm["microvmId"]]
    assert "nextToken" not in listed


def test_the_endpoint_is_a_bare_hostname(client, image) -> None:
    """[M 2026-09-15] ``<uuid>.lambda-microvm.<region>.on.aws``, no ``https://``; the sample shows
    a uuid other than the id's (GT §8, Q14/Q23)."""
    vm = run(client, image)
    host = vm["endpoint"]
    assert re.fullmatch(r"[0-9a-f-]{36}\.lambda-microvm\.us-east-1\.on\.aws", host), host
    assert "://" not in host and host.split(".")[0] != vm["microvmId"].removeprefix("microvm-")
    assert get(client, vm["microvmId"])["endpoint"] == host


def test_first_200_about_two_seconds_after_run(client, image, clock) -> None:
    """[M 2026-09-15] RunMicrovm answers PENDING; first HTTP 200 p50 1.85 s / p95 2.13 s (GT §3, Q2)."""
    assert measured.PENDING_SECONDS == 2.0
    vm_id = run(client, image)["microvmId"]
    clock.advance(1.9)
    assert state(client, vm_id) == "PENDING"
    clock.advance(0.1)
    assert state(client, vm_id) == "RUNNING"


def test_first_launches_of_a_fresh_version_are_slow(emulator, client, image, clock) -> None:
    """[M 2026-10-07] the first launches of a freshly published version took 26-65 s (first 3 of v1,
    first 5 of v2), 6.9-12.5 s afterwards (GT §3, Q146): the first 5 of each new version draw from
    26-65 s, the next ones take the usual 2 s."""
    emulator.publish_version("mi-agente")  # 2.0, fresh
    vms = [run(client, image)["microvmId"] for _ in range(6)]
    clock.advance(2)
    assert [state(client, v) for v in vms] == ["PENDING"] * 5 + ["RUNNING"]
    clock.advance(23.9)
    assert {state(client, v) for v in vms[:5]} == {"PENDING"}  # none before 26 s
    clock.advance(65 - 25.9)
    assert {state(client, v) for v in vms[:5]} == {"RUNNING"}  # all by 65 s
    # An image made by create_image() is one published long ago: its launches are not first ones.
    other = emulator.create_image("viejo")
    old = run(client, other)["microvmId"]
    clock.advance(2)
    assert state(client, old) == "RUNNING"


def test_suspend_and_resume_as_measured(emulator, client, image, clock) -> None:
    """[M 2026-09-15/16] SUSPENDED in about 1.4 s; suspend on a SUSPENDED VM answers 200 (three in a
    row); the VM stays SUSPENDED while its /resume hook runs and is RUNNING when it returns, the
    first 200 1.2 s after the call; GetMicrovm then still says PENDING (0.1-0.5 s after the hook
    returned, measured 2026-09-24), then RUNNING; resume on a RUNNING VM answers 200 (GT §3,
    Q4/Q38/Q40)."""
    vm_id = run(client, image)["microvmId"]
    clock.advance(2)
    assert client.suspend_microvm(microvmIdentifier=vm_id)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert state(client, vm_id) == "SUSPENDING"
    client.suspend_microvm(microvmIdentifier=vm_id)  # idempotent while suspending
    clock.advance(1.3)
    assert state(client, vm_id) == "SUSPENDING"
    clock.advance(0.2)  # 1.4 s, and a margin for the float sums of a clock at 1.79e9
    assert state(client, vm_id) == "SUSPENDED"
    for _ in range(3):
        assert client.suspend_microvm(microvmIdentifier=vm_id)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert state(client, vm_id) == "SUSPENDED"
    client.resume_microvm(microvmIdentifier=vm_id)
    assert state(client, vm_id) == "SUSPENDED"  # the /resume hook runs
    client.resume_microvm(microvmIdentifier=vm_id)  # a second resume meanwhile: 200, same resume
    clock.advance(1.1)
    assert state(client, vm_id) == "SUSPENDED"
    clock.advance(0.2)
    assert state(client, vm_id) == "PENDING"  # the hook returned: serving, the control plane says PENDING
    clock.advance(0.5)
    assert state(client, vm_id) == "RUNNING"
    history = _history(emulator, vm_id)
    assert history == ["PENDING", "RUNNING", "SUSPENDING", "SUSPENDED", "PENDING", "RUNNING"]
    assert client.resume_microvm(microvmIdentifier=vm_id)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert _history(emulator, vm_id) == history  # no new generation from a resume on RUNNING


def _history(emulator, vm_id) -> list[str]:
    (vm,) = [vm for vm in emulator.microvms_ever() if vm["microvmId"] == vm_id]
    return [h[1] for h in vm["history"]]


def test_documented_profile_answers_conflicts(clock) -> None:
    """[docs] suspend only from RUNNING and resume only from SUSPENDED, else 409 (GT §3)."""
    with MicrovmsEmulator(clock=clock, profile="documented", consistency_seconds=0) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("estricto")
        vm_id = run(client, image)["microvmId"]
        clock.advance(2)
        response = error(lambda: client.resume_microvm(microvmIdentifier=vm_id))
        assert response["Error"]["Code"] == "ConflictException" and response["resourceId"] == vm_id
        client.suspend_microvm(microvmIdentifier=vm_id)
        clock.advance(1.4)
        assert error(lambda: client.suspend_microvm(microvmIdentifier=vm_id))["ResponseMetadata"]["HTTPStatusCode"] == 409


def test_conflicts_in_both_profiles(client, image, clock) -> None:
    vm_id = run(client, image)["microvmId"]
    assert error(lambda: client.suspend_microvm(microvmIdentifier=vm_id))["Error"]["Code"] == "ConflictException"  # PENDING
    assert error(lambda: client.resume_microvm(microvmIdentifier=vm_id))["Error"]["Code"] == "ConflictException"
    client.terminate_microvm(microvmIdentifier=vm_id)
    assert error(lambda: client.suspend_microvm(microvmIdentifier=vm_id))["Error"]["Code"] == "ConflictException"
    assert error(lambda: client.resume_microvm(microvmIdentifier=vm_id))["Error"]["Code"] == "ConflictException"


def test_terminate_is_idempotent_and_says_success(client, image, clock) -> None:
    """[M 2026-09-15] TERMINATING, then TERMINATED with stateReason "Success." (GT §3); [3rd]
    TERMINATED at +3 s (microvms.md §1.1); terminate is idempotent (model)."""
    vm_id = run(client, image)["microvmId"]
    client.terminate_microvm(microvmIdentifier=vm_id)
    assert state(client, vm_id) == "TERMINATING"
    client.terminate_microvm(microvmIdentifier=vm_id)
    clock.advance(3)
    got = get(client, vm_id)
    assert (got["state"], got["stateReason"]) == ("TERMINATED", "Success.")
    assert got["terminatedAt"] == dt.datetime.fromtimestamp(clock.now(), dt.timezone.utc)
    client.terminate_microvm(microvmIdentifier=vm_id)


def test_terminated_vms_stay_listed_twenty_minutes(client, image, clock) -> None:
    """[M 2026-09-15] TERMINATED VMs keep appearing for at least about 20 minutes (GT §4, Q13)."""
    vm_id = run(client, image)["microvmId"]
    client.terminate_microvm(microvmIdentifier=vm_id)
    clock.advance(3 + 1199)
    assert [i["state"] for i in client.list_microvms(imageIdentifier=image)["items"]] == ["TERMINATED"]
    assert state(client, vm_id) == "TERMINATED"
    clock.advance(1)
    assert client.list_microvms(imageIdentifier=image)["items"] == []
    assert error(lambda: client.get_microvm(microvmIdentifier=vm_id))["Error"]["Code"] == "ResourceNotFoundException"


def test_a_vm_that_ended_unseen_is_gone_after_the_linger_too(client, image, clock) -> None:
    """A VM that ends on its own (here its maximum duration) and is never looked at until after
    the 20-minute linger is gone then, like one that was watched: the end is dated when it
    happened, not when it was first seen."""
    vm_id = run(client, image, maximumDurationInSeconds=100)["microvmId"]
    clock.advance(100 + 3 + 1200 + 1)  # ended at 100 s, TERMINATED at 103 s, unlisted 1,200 s later
    assert error(lambda: client.get_microvm(microvmIdentifier=vm_id))["Error"]["Code"] == "ResourceNotFoundException"
    assert client.list_microvms(imageIdentifier=image)["items"] == []


def test_maximum_duration_counts_suspended_time(client, image, clock) -> None:
    """[model/docs] maximumDurationInSeconds counts running + suspended time from startedAt (GT §5);
    [M 2026-10-02] the reason is "MicroVM exceeded maximum lifetime." (Q105)."""
    vm_id = run(client, image, maximumDurationInSeconds=100)["microvmId"]
    clock.advance(2)
    client.suspend_microvm(microvmIdentifier=vm_id)
    clock.advance(97)
    assert state(client, vm_id) == "SUSPENDED"
    clock.advance(1)
    got = get(client, vm_id)
    assert (got["state"], got["stateReason"]) == ("TERMINATING", "MicroVM exceeded maximum lifetime.")
    clock.advance(3)
    assert state(client, vm_id) == "TERMINATED"


def test_default_maximum_duration_is_eight_hours(client, image, clock) -> None:
    vm = run(client, image)
    assert vm["maximumDurationInSeconds"] == 28_800
    clock.advance(28_800)
    assert state(client, vm["microvmId"]) == "TERMINATING"


def test_a_failing_suspend_hook_terminates_the_vm(emulator, client, image, clock) -> None:
    """[M 2026-09-15] /suspend answering 500: the call is accepted, within < 5 s the VM is TERMINATED
    with the measured stateReason, no retry (GT §3, Q10)."""
    vm_id = run(client, image)["microvmId"]
    clock.advance(2)
    emulator.inject("SuspendMicrovm", "suspend_hook_failure")
    assert client.suspend_microvm(microvmIdentifier=vm_id)["ResponseMetadata"]["HTTPStatusCode"] == 200
    clock.advance(4.99)
    got = get(client, vm_id)
    assert got["state"] == "TERMINATED"
    assert got["stateReason"] == ("Suspend lifecycle hook returned HTTP status 500. Please check your hook "
                                  "endpoint and application logs for more details.")
    assert emulator.traffic(vm_id) == 504  # the endpoint no longer answers


def test_an_exited_app_reads_running_for_fifteen_seconds(emulator, client, image, clock) -> None:
    """[M 2026-09-22/24] PID 1 exits: 502 at once, GetMicrovm RUNNING for about 15 s, then
    TERMINATING/TERMINATED "Container Stopped with Exit Code: 0", terminatedAt 15.3-18 s after
    (GT §3, Q58/Q63)."""
    vm_id = run(client, image)["microvmId"]
    clock.advance(2)
    exited = clock.now()
    emulator.exit_app(vm_id, code=0)
    assert emulator.traffic(vm_id) == 502
    clock.advance(14.9)
    assert state(client, vm_id) == "RUNNING"
    clock.advance(0.1)
    got = get(client, vm_id)
    assert (got["state"], got["stateReason"]) == ("TERMINATING", "Container Stopped with Exit Code: 0")
    clock.advance(3)
    got = get(client, vm_id)
    assert got["state"] == "TERMINATED" and 15.3 <= got["terminatedAt"].timestamp() - exited <= 18


def test_crash_fault_ends_new_vms_of_one_image(emulator, client, image, clock) -> None:
    other = emulator.create_image("sano")
    emulator.inject("RunMicrovm", "crash", image=image, after_seconds=20, times=None)
    crashing = run(client, image)["microvmId"]
    healthy = run(client, other)["microvmId"]
    clock.advance(20 + 15 + 3)
    got = get(client, crashing)
    assert (got["state"], got["stateReason"]) == ("TERMINATED", "Container Stopped with Exit Code: 1")
    assert state(client, healthy) == "RUNNING"
    emulator.crash(healthy, reason="host_failure")
    clock.advance(15)
    assert get(client, healthy)["stateReason"] == "host_failure"


def test_idle_policy_suspends_and_ends(emulator, client, image, clock) -> None:
    policy = {"maxIdleDurationSeconds": 60, "suspendedDurationSeconds": 300, "autoResumeEnabled": True}
    vm_id = run(client, image, idlePolicy=policy)["microvmId"]
    clock.advance(2 + 59)
    assert state(client, vm_id) == "RUNNING"
    assert emulator.traffic(vm_id) == 200  # activity pushes the idle deadline
    clock.advance(59)
    assert state(client, vm_id) == "RUNNING"
    clock.advance(1)
    assert state(client, vm_id) == "SUSPENDING"
    clock.advance(1.4)
    assert state(client, vm_id) == "SUSPENDED"
    before = clock.now()
    assert emulator.traffic(vm_id) == 200  # auto-resume: the proxy holds the request until /resume returns
    assert clock.now() == pytest.approx(before + 1.2) and state(client, vm_id) == "PENDING"  # serving (GT §3)
    clock.advance(0.5)
    assert state(client, vm_id) == "RUNNING"
    clock.advance(60 + 1.4 + 300)
    got = get(client, vm_id)
    assert got["state"] == "TERMINATING" and got["stateReason"] == measured.REASON_IDLE


def test_no_auto_resume_means_502(emulator, client, image, clock) -> None:
    policy = {"maxIdleDurationSeconds": 60, "suspendedDurationSeconds": 100, "autoResumeEnabled": False}
    vm_id = run(client, image, idlePolicy=policy)["microvmId"]
    assert emulator.traffic(vm_id) == 502  # PENDING
    clock.advance(2 + 60 + 1.4)
    assert state(client, vm_id) == "SUSPENDED"
    assert emulator.traffic(vm_id) == 502
    assert emulator.traffic("microvm-unknown") == 404


def test_zero_suspended_duration_ends_on_suspend(client, image, clock) -> None:
    policy = {"maxIdleDurationSeconds": 60, "suspendedDurationSeconds": 0, "autoResumeEnabled": True}
    vm_id = run(client, image, idlePolicy=policy)["microvmId"]
    clock.advance(2 + 60 + 1.4)
    assert state(client, vm_id) == "TERMINATING"


def test_memory_quota_is_402(clock) -> None:
    """[model] ServiceQuotaExceededException is 402; [docs] RUNNING + SUSPENDED count (GT §2)."""
    with MicrovmsEmulator(clock=clock, memory_quota_mib=4096, rate_limits=False) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("grande", memory_mib=2048)
        first, second = run(client, image), run(client, image)
        clock.advance(2)
        client.suspend_microvm(microvmIdentifier=second["microvmId"])
        clock.advance(2)
        response = error(lambda: run(client, image))
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 402 and response["quotaCode"] == "L-CD1C0CC4"
        client.terminate_microvm(microvmIdentifier=first["microvmId"])
        run(client, image)  # TERMINATING VMs no longer count
        assert emu.memory_in_use_mib() == 4096


def test_a_clock_moved_by_years_ends_everything_once(client, image, clock, emulator) -> None:
    vm_ids = [run(client, image, idlePolicy={"maxIdleDurationSeconds": 60, "suspendedDurationSeconds": 10**6,
                                             "autoResumeEnabled": True})["microvmId"] for _ in range(3)]
    clock.advance(10 * 365 * 86_400)
    assert client.list_microvms()["items"] == []
    assert emulator.memory_in_use_mib() == 0
    ever = emulator.microvms_ever()
    assert {vm["state"] for vm in ever} == {"TERMINATED"}
    assert [h[1] for h in ever[0]["history"]] == ["PENDING", "RUNNING", "SUSPENDING", "SUSPENDED", "TERMINATING", "TERMINATED"]
    assert {vm["microvmId"] for vm in ever} == set(vm_ids)


def test_an_unimplemented_clock_direction_is_refused(clock) -> None:
    with pytest.raises(ValueError):
        clock.advance(-30)


def test_options_are_checked() -> None:
    for bad in ({"pending_seconds": -1}, {"pending_seconds": float("nan")}, {"terminated_linger_seconds": float("inf")},
                {"fresh_launch_seconds": (65, 26)}, {"memory_quota_mib": -1}, {"consistency_seconds": -0.1},
                {"profile": "optimistic"}, {"hold_seconds": 1000}, {"rate_limits": {"RunMicrovm": (5, 0)}},
                {"fresh_launches": -2}):
        with pytest.raises(ValueError):
            MicrovmsEmulator(clock=VirtualClock(), **bad)
    emulator = MicrovmsEmulator(clock=VirtualClock())
    with pytest.raises(ValueError):
        emulator.pending_seconds = -3
    assert emulator.pending_seconds == 2.0
    with pytest.raises(ValueError):
        emulator.stale_seconds = float("nan")
    with pytest.raises(ValueError):
        emulator.create_image("raro", memory_mib=3000)
    with pytest.raises(ValueError):
        emulator.inject("RunMicrovm", "meteor")
    with pytest.raises(ValueError):
        emulator.inject("RunMicrovm", "InternalServer", probability=2)


@pytest.mark.parametrize("region,quota", [("us-east-1", 1024 * 1024), ("us-east-2", 1024 * 1024),
                                          ("us-west-2", 1024 * 1024), ("ap-northeast-1", 1024 * 1024),
                                          ("eu-west-1", 400 * 1024), ("ap-south-1", 400 * 1024)])
def test_the_default_memory_quota_depends_on_the_region(region: str, quota: int) -> None:
    """[docs] 1,024 GB in the four large regions, 400 GB elsewhere (GT §2); an explicit value wins."""
    with MicrovmsEmulator(clock=VirtualClock(), region=region) as emu:
        assert emu.memory_quota_mib == quota
    with MicrovmsEmulator(clock=VirtualClock(), region=region, memory_quota_mib=8192) as emu:
        assert emu.memory_quota_mib == 8192

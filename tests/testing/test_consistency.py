"""Late reads and stable paging: GetMicrovm and ListMicrovms are eventually consistent
([model] "determine readiness by connecting to the endpoint"; [M 2026-09-15] RUNNING right after
terminate, TERMINATING at 0.14 s; [M 2026-09-24] PENDING 0.1-0.5 s after /resume returned, GT §3)."""

from __future__ import annotations

import base64
import json
from collections import Counter

import pytest

from rayito_constructs.testing import MicrovmsEmulator, measured

from ..emulator_helpers import microvms_client
from .helpers import error, run


@pytest.fixture
def late(clock):
    """The measured default: each read up to 0.5 s late."""
    with MicrovmsEmulator(clock=clock, seed=5, rate_limits=False) as emu:
        yield emu


def test_the_default_lag_is_the_measured_half_second(late) -> None:
    assert late.consistency_seconds == measured.CONSISTENCY_SECONDS == 0.5


def test_a_new_vm_is_missing_from_lists_for_a_while(late, clock) -> None:
    client = microvms_client(late.endpoint_url)
    image = late.create_image("nuevo")
    vm = run(client, image)["microvmId"]
    assert client.list_microvms(imageIdentifier=image)["items"] == []  # started, not listed yet
    assert client.get_microvm(microvmIdentifier=vm)["state"] == "PENDING"  # a get by id finds it
    clock.advance(0.5)
    assert [i["microvmId"] for i in client.list_microvms(imageIdentifier=image)["items"]] == [vm]


def test_a_terminated_vm_still_reads_running(late, clock) -> None:
    client = microvms_client(late.endpoint_url)
    image = late.create_image("viejo")
    vm = run(client, image)["microvmId"]
    clock.advance(10)
    client.terminate_microvm(microvmIdentifier=vm)
    assert client.get_microvm(microvmIdentifier=vm)["state"] == "RUNNING"
    assert client.list_microvms(imageIdentifier=image)["items"][0]["state"] == "RUNNING"
    assert late.state_of(vm) == "TERMINATING"  # the truth, for assertions
    clock.advance(0.5)
    assert client.get_microvm(microvmIdentifier=vm)["state"] == "TERMINATING"


def test_reads_in_a_row_need_not_agree(late, clock) -> None:
    """Each read picks its own lag (seeded): right around a transition, reads flap."""
    client = microvms_client(late.endpoint_url)
    image = late.create_image("flap")
    vm = run(client, image)["microvmId"]
    clock.advance(2.25)  # RUNNING since 0.25 s
    seen = Counter(client.get_microvm(microvmIdentifier=vm)["state"] for _ in range(40))
    assert set(seen) == {"PENDING", "RUNNING"}


def test_lag_is_configurable_and_can_be_large(clock) -> None:
    with MicrovmsEmulator(clock=clock, seed=1, consistency_seconds=0, rate_limits=False) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("seis")
        vm = run(client, image)["microvmId"]
        assert [i["microvmId"] for i in client.list_microvms()["items"]] == [vm]  # exact reads
        clock.advance(10)
        emu.stale_seconds = 6  # lists omit VMs younger than 6 s (an adversarial setting)
        other = run(client, image)["microvmId"]
        clock.advance(5.9)
        assert [i["microvmId"] for i in client.list_microvms()["items"]] == [vm]
        clock.advance(0.2)
        assert {i["microvmId"] for i in client.list_microvms()["items"]} == {vm, other}


def test_page_tokens_survive_pruning_between_pages(clock) -> None:
    """A token is a cursor, not an offset: VMs pruned between two pages shift nothing."""
    with MicrovmsEmulator(clock=clock, seed=2, consistency_seconds=0, rate_limits=False) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("paginas")
        vms = []
        for _ in range(6):
            vms.append(run(client, image)["microvmId"])
            clock.advance(1)
        for vm in vms[:3]:
            client.terminate_microvm(microvmIdentifier=vm)
        clock.advance(3)
        first = client.list_microvms(imageIdentifier=image, maxResults=2)
        assert [i["microvmId"] for i in first["items"]] == vms[:2]
        clock.advance(1200)  # the three TERMINATED ones are pruned now
        second = client.list_microvms(imageIdentifier=image, maxResults=2, nextToken=first["nextToken"])
        assert [i["microvmId"] for i in second["items"]] == vms[3:5]  # nothing skipped
        third = client.list_microvms(imageIdentifier=image, maxResults=2, nextToken=second["nextToken"])
        assert [i["microvmId"] for i in third["items"]] == vms[5:] and "nextToken" not in third


def test_the_paginator_sees_every_vm_once_while_vms_come_and_go(clock) -> None:
    with MicrovmsEmulator(clock=clock, seed=3, consistency_seconds=0, rate_limits=False) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("muchos")
        vms = []
        for _ in range(7):
            vms.append(run(client, image)["microvmId"])
            clock.advance(1)
        seen = []
        for n, page in enumerate(client.get_paginator("list_microvms").paginate(PaginationConfig={"PageSize": 2})):
            seen += [i["microvmId"] for i in page["items"]]
            if n == 0:
                run(client, image)  # a VM started during paging comes after the cursor: listed last
                client.terminate_microvm(microvmIdentifier=vms[3])
        assert seen[:7] == vms and len(seen) == len(set(seen)) == 8


def test_a_token_for_other_filters_or_forged_is_refused(clock) -> None:
    with MicrovmsEmulator(clock=clock, seed=4, consistency_seconds=0, rate_limits=False) as emu:
        client = microvms_client(emu.endpoint_url)
        a, b = emu.create_image("a"), emu.create_image("b")
        for _ in range(3):
            run(client, a)
        token = client.list_microvms(imageIdentifier=a, maxResults=1)["nextToken"]
        assert "other parameters" in error(lambda: client.list_microvms(imageIdentifier=b, nextToken=token))["Error"]["Message"]
        forged = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        for bad_key in (["x", 1], [1.0], None, [float("inf"), "a"], [1.0, 2]):
            forged["k"] = bad_key
            text = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode()
            assert error(lambda: client.list_microvms(imageIdentifier=a, nextToken=text))["Error"]["Code"] == "ValidationException"
        for garbage in ("garbage", "!!!", "e30", "a" * 5000):
            assert error(lambda: client.list_microvms(nextToken=garbage))["Error"]["Code"] == "ValidationException"
        images_token = client.list_microvm_images(maxResults=1)["nextToken"]
        assert error(lambda: client.list_microvms(nextToken=images_token))["Error"]["Code"] == "ValidationException"

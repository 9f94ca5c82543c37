"""Images and versions, as measured (GT §7): what a rollout and a pruning of old versions meet."""

from __future__ import annotations

import pytest

from ..emulator_helpers import assert_fits_model
from .helpers import BASE, ROLE, error, run, state

ARTIFACT = {"uri": "s3://bucket/agent.zip"}


def create(client, name="publicado", **kw):
    return client.create_microvm_image(name=name, baseImageArn=BASE, buildRoleArn=ROLE, codeArtifact=ARTIFACT, **kw)


def update(client, arn, **kw):
    return client.update_microvm_image(imageIdentifier=arn, baseImageArn=BASE, buildRoleArn=ROLE, codeArtifact=ARTIFACT, **kw)


def test_create_build_run_and_tags(client, clock) -> None:
    created = create(client, resources=[{"minimumMemoryInMiB": 4096}], tags={"team": "ia"},
                     environmentVariables={"MODE": "x"})
    assert created["ResponseMetadata"]["HTTPStatusCode"] == 201
    assert_fits_model("CreateMicrovmImage", created)
    assert (created["state"], created["imageVersion"]) == ("CREATING", "1.0")
    arn = created["imageArn"]
    assert arn == "arn:aws:lambda:us-east-1:123456789012:microvm-image:publicado"
    response = error(lambda: run(client, arn))  # no active version while building
    assert response["Error"]["Message"] == f"No active version found for MicroVM image {arn}"
    clock.advance(180)
    got = client.get_microvm_image(imageIdentifier=arn)
    assert_fits_model("GetMicrovmImage", got)
    assert got["state"] == "CREATED" and got["latestActiveImageVersion"] == "1.0"
    assert run(client, arn)["state"] == "PENDING"
    assert [i["name"] for i in client.list_microvm_images(nameFilter="publi")["items"]] == ["publicado"]
    assert client.tag_resource(Resource=arn, Tags={"env": "dev"})["ResponseMetadata"]["HTTPStatusCode"] == 204
    client.untag_resource(Resource=arn, TagKeys=["team"])
    assert client.list_tags(Resource=arn)["Tags"] == {"env": "dev"}
    assert error(lambda: create(client))["Error"]["Code"] == "ConflictException"


def test_measured_create_rules(client) -> None:
    """[M 2026-09-30] only 512/1024/2048/4096/8192 MiB (Q87); the artifact is an S3 URI (Q84);
    [M 2026-10-02] create rejects baseImageVersion "1.0": a single major version (Q115)."""
    assert "4096" in error(lambda: create(client, resources=[{"minimumMemoryInMiB": 3000}]))["Error"]["Message"]
    bad_uri = error(lambda: client.create_microvm_image(name="x", baseImageArn=BASE, buildRoleArn=ROLE,
                                                        codeArtifact={"uri": "123.dkr.ecr.us-east-1.amazonaws.com/x:1"}))
    assert bad_uri["Error"]["Code"] == "ValidationException"
    message = error(lambda: create(client, name="y", baseImageVersion="1.0"))["Error"]["Message"]
    assert message == "Expected a single major version number (e.g., 1)"
    assert create(client, name="z", baseImageVersion="1")["baseImageVersion"] == "1.0"


def test_the_eleventh_concurrent_build_is_refused(client) -> None:
    """[M 2026-09-30] the 11th simultaneous create: ServiceQuotaExceededException "maximum number of
    concurrent builds" (10 in us-east-1, GT §2, Q83)."""
    for i in range(10):
        create(client, name=f"build-{i}")
    response = error(lambda: create(client, name="build-10"))
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 402
    assert "maximum number of concurrent builds" in response["Error"]["Message"]


def test_update_makes_a_new_version_and_conflicts_while_updating(emulator, client, image, clock) -> None:
    """[M 2026-09-15] versions 1.0, 2.0...; every update builds a new one; changing a version's
    status while another builds: "MicroVM Image is already in state: UPDATING" (GT §7)."""
    updated = update(client, image, baseImageVersion="1")
    assert_fits_model("UpdateMicrovmImage", updated)
    assert (updated["imageVersion"], updated["state"], updated["baseImageVersion"]) == ("2.0", "UPDATING", "1.0")
    response = error(lambda: client.update_microvm_image_version(imageIdentifier=image, imageVersion="1.0", status="INACTIVE"))
    assert response["Error"]["Code"] == "ConflictException"
    assert response["Error"]["Message"] == "MicroVM Image is already in state: UPDATING"
    assert error(lambda: update(client, image))["Error"]["Code"] == "ConflictException"
    assert run(client, image)["imageVersion"] == "1.0"  # 2.0 still builds
    clock.advance(180)
    assert client.get_microvm_image(imageIdentifier=image)["state"] == "UPDATED"
    assert run(client, image)["imageVersion"] == "2.0"
    versions = client.list_microvm_image_versions(imageIdentifier=image)
    assert_fits_model("ListMicrovmImageVersions", versions)
    assert [(v["imageVersion"], v["state"], v["status"]) for v in versions["items"]] == [
        ("1.0", "SUCCESSFUL", "ACTIVE"), ("2.0", "SUCCESSFUL", "ACTIVE")]


def test_list_items_carry_no_environment_variables(client, clock) -> None:
    """[M 2026-10-02] ListMicrovmImageVersions items have no environmentVariables; only
    GetMicrovmImageVersion does (Q118)."""
    arn = create(client, environmentVariables={"MODE": "x"})["imageArn"]
    clock.advance(180)
    assert "environmentVariables" not in client.list_microvm_image_versions(imageIdentifier=arn)["items"][0]
    got = client.get_microvm_image_version(imageIdentifier=arn, imageVersion="1.0")
    assert_fits_model("GetMicrovmImageVersion", got)
    assert got["environmentVariables"] == {"MODE": "x"}


def test_inactive_versions_do_not_run(emulator, client, image, clock) -> None:
    emulator.publish_version("mi-agente", fresh=False)  # 2.0
    assert run(client, image)["imageVersion"] == "2.0"
    done = client.update_microvm_image_version(imageIdentifier=image, imageVersion="2.0", status="INACTIVE")
    assert_fits_model("UpdateMicrovmImageVersion", done)
    assert run(client, image)["imageVersion"] == "1.0"  # the latest ACTIVE one
    assert error(lambda: run(client, image, imageVersion="2.0"))["Error"]["Code"] == "ResourceNotFoundException"
    client.update_microvm_image_version(imageIdentifier=image, imageVersion="1.0", status="INACTIVE")
    response = error(lambda: run(client, image))
    assert response["Error"]["Message"] == f"No active version found for MicroVM image {image}"  # [M 2026-10-02]
    assert len(emulator.microvms()) == 2  # and no VM was made


def test_deleting_versions_as_measured(emulator, client, image, clock) -> None:
    """[M 2026-09-16] deleting an ACTIVE version works; the image is UPDATING about 5.4 s and back to
    UPDATED; a chained delete meanwhile is a ConflictException; deleting it again succeeds
    (idempotent, model) (GT §7, Q49)."""
    emulator.publish_version("mi-agente", fresh=False)
    emulator.publish_version("mi-agente", fresh=False)
    vm = run(client, image, imageVersion="1.0")["microvmId"]
    deleted = client.delete_microvm_image_version(imageIdentifier=image, imageVersion="1.0")
    assert_fits_model("DeleteMicrovmImageVersion", deleted)
    assert deleted["state"] == "DELETING"
    assert client.get_microvm_image(imageIdentifier=image)["state"] == "UPDATING"
    response = error(lambda: client.delete_microvm_image_version(imageIdentifier=image, imageVersion="2.0"))
    assert response["Error"]["Code"] == "ConflictException"
    clock.advance(5.3)
    assert client.get_microvm_image(imageIdentifier=image)["state"] == "UPDATING"
    clock.advance(0.2)
    assert client.get_microvm_image(imageIdentifier=image)["state"] == "UPDATED"
    assert client.delete_microvm_image_version(imageIdentifier=image, imageVersion="1.0")["state"] == "DELETED"
    assert error(lambda: client.get_microvm_image_version(imageIdentifier=image, imageVersion="1.0"))["Error"]["Code"] == "ResourceNotFoundException"
    assert [v["imageVersion"] for v in client.list_microvm_image_versions(imageIdentifier=image)["items"]] == ["2.0", "3.0"]
    assert state(client, vm) in ("PENDING", "RUNNING")  # a VM of a deleted version keeps running
    assert error(lambda: client.delete_microvm_image_version(imageIdentifier=image, imageVersion="9.0"))["Error"]["Code"] == "ResourceNotFoundException"


def test_deleting_an_image(emulator, client, image, clock) -> None:
    """[M 2026-09-16] delete-microvm-image with ACTIVE versions: DELETING at once."""
    deleted = client.delete_microvm_image(imageIdentifier=image)
    assert_fits_model("DeleteMicrovmImage", deleted)
    assert deleted["state"] == "DELETING"
    assert error(lambda: run(client, image))["Error"]["Code"] == "ResourceNotFoundException"
    clock.advance(60)
    assert error(lambda: client.get_microvm_image(imageIdentifier=image))["Error"]["Code"] == "ResourceNotFoundException"
    emulator.create_image("mi-agente")  # the name is free again


def test_a_new_version_has_its_own_slow_first_launches(emulator, client, image, clock) -> None:
    """[M 2026-10-07] 48-65 s for the first launches of v1, 26-63 s for v2, ~2 s afterwards (Q146)."""
    update(client, image)
    clock.advance(180)
    first = [run(client, image)["microvmId"] for _ in range(5)]
    clock.advance(25)
    assert {state(client, v) for v in first} == {"PENDING"}
    clock.advance(40)
    assert {state(client, v) for v in first} == {"RUNNING"}
    later = run(client, image)["microvmId"]
    clock.advance(2)
    assert state(client, later) == "RUNNING"
    old = run(client, image, imageVersion="1.0")["microvmId"]  # an old version is not fresh
    clock.advance(2)
    assert state(client, old) == "RUNNING"


def test_version_list_pages_and_limits(emulator, client, image) -> None:
    for _ in range(4):
        emulator.publish_version("mi-agente", fresh=False)
    pages = list(client.get_paginator("list_microvm_image_versions").paginate(
        imageIdentifier=image, PaginationConfig={"PageSize": 2}))
    assert [[v["imageVersion"] for v in p["items"]] for p in pages] == [["1.0", "2.0"], ["3.0", "4.0"], ["5.0"]]
    for _ in range(45):
        emulator.publish_version("mi-agente", fresh=False)
    response = error(lambda: update(client, image))
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 402  # [docs] 50 versions per image
    with pytest.raises(ValueError):
        emulator.publish_version("mi-agente", "3.0")  # exists
    assert error(lambda: client.list_microvm_image_versions(imageIdentifier="mi-agente"))["Error"]["Message"] == "Invalid ARN format"


def test_image_client_tokens(client) -> None:
    first = create(client, name="idem", clientToken="c-1")
    again = create(client, name="idem", clientToken="c-1")
    assert again["imageArn"] == first["imageArn"]
    assert error(lambda: create(client, name="otro", clientToken="c-1"))["Error"]["Code"] == "ConflictException"


def test_a_version_being_deleted_does_not_count_as_a_remaining_one() -> None:
    """[3rd] microvms.md §1: the last remaining version cannot be deleted alone; one already being
    deleted does not remain."""
    from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

    from ..emulator_helpers import microvms_client

    clock = VirtualClock()
    with MicrovmsEmulator(clock=clock, seed=5, consistency_seconds=0) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("dos")
        emu.publish_version("dos")
        client.delete_microvm_image_version(imageIdentifier=image, imageVersion="1.0")
        for _ in range(2):  # while 1.0 is DELETING, and after it is gone
            try:
                client.delete_microvm_image_version(imageIdentifier=image, imageVersion="2.0")
            except client.exceptions.ValidationException as exc:
                assert "This is the last version. Please delete the entire image" in str(exc)
            else:
                raise AssertionError("the last version was deleted")
            clock.advance(6)
        assert client.get_microvm_image_version(imageIdentifier=image, imageVersion="2.0")["state"] == "SUCCESSFUL"


def test_managed_base_images_and_their_versions_page_by_cursor() -> None:
    """[M 2026-09-15/16] ``list-managed-microvm-image-versions`` lists ``0`` and ``1`` (GT §7); the
    shapes are botocore's, the pages cursors as in the other lists."""
    from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

    from ..emulator_helpers import microvms_client

    with MicrovmsEmulator(clock=VirtualClock(), seed=5, region="eu-west-1") as emu:
        client = microvms_client(emu.endpoint_url)  # signed for us-east-1: the emulator's region is its own
        base = "arn:aws:lambda:eu-west-1:aws:microvm-image:al2023-1"
        images = client.list_managed_microvm_images()
        assert [i["imageArn"] for i in images["items"]] == [base] and "nextToken" not in images
        assert_fits_model("ListManagedMicrovmImages", images)
        first = client.list_managed_microvm_image_versions(imageIdentifier=base, maxResults=1)
        assert_fits_model("ListManagedMicrovmImageVersions", first)
        second = client.list_managed_microvm_image_versions(imageIdentifier=base, maxResults=1, nextToken=first["nextToken"])
        assert [i["imageVersion"] for i in first["items"] + second["items"]] == ["0", "1"]
        assert all(i["status"] == "AVAILABLE" and i["imageArn"] == base for i in first["items"] + second["items"])
        assert "nextToken" not in second
        paginated = client.get_paginator("list_managed_microvm_image_versions").paginate(
            imageIdentifier=base, PaginationConfig={"PageSize": 1})
        assert [i["imageVersion"] for p in paginated for i in p["items"]] == ["0", "1"]
        other = "arn:aws:lambda:eu-west-1:aws:microvm-image:al2023-9"
        assert error(lambda: client.list_managed_microvm_image_versions(imageIdentifier=other))["Error"]["Code"] == \
            "ResourceNotFoundException"
        assert error(lambda: client.list_managed_microvm_image_versions(imageIdentifier="al2023-1"))["Error"]["Message"] == \
            "Invalid ARN format"
        forged = error(lambda: client.list_managed_microvm_image_versions(imageIdentifier=base, nextToken="bm9wZQ"))
        assert forged["Error"]["Code"] == "ValidationException"

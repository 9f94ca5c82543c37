"""The fleet's server and the reconciler's fleet source when what serving reads is missing or
refused: every failure is one answer in the ledger (``failed`` with its reason, never a secret),
and a tick without a fleet makes no MicroVMs call, with the reason it says.

The server's handler runs with its own clients against moto (SSM, Secrets Manager, DynamoDB); the
fleet source's error paths are driven with stand-ins for the SSM and Secrets Manager clients that
raise botocore's own errors (the codes those services answer)."""

from __future__ import annotations

from typing import Any, Iterator

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from rayito._payload import generate_access_token

from lambdas.reconciler import server as server_module
from lambdas.reconciler.fleet_source import Absent, Deployed, RecipeSource, TokenSource, Unreadable
from lambdas.reconciler.ledger import DynamoDBLedger

from .harness import put_fleet_state

TOKEN = generate_access_token()

FLEET = "servido"
TABLE = "server-answers-ledger"
SECRET = f"rayito/agents/{FLEET}/access-token"


@pytest.fixture
def world(aws: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    session = boto3.Session(region_name="us-east-1")
    ddb, ssm, secrets = session.client("dynamodb"), session.client("ssm"), session.client("secretsmanager")
    try:  # moto's backends outlive a test in its worker (list_tables pages at 100: not a check)
        DynamoDBLedger.create_table(ddb, TABLE)
    except ddb.exceptions.ResourceInUseException:
        pass
    for name in (f"/rayito/agents/{FLEET}/recipe",):
        try:
            ssm.delete_parameter(Name=name)
        except ssm.exceptions.ParameterNotFound:
            pass
    try:
        secrets.delete_secret(SecretId=SECRET, ForceDeleteWithoutRecovery=True)
    except secrets.exceptions.ResourceNotFoundException:
        pass
    env = {"FLEET_NAME": FLEET, "ACCESS_TOKEN_SECRET": SECRET, "LEDGER_TABLE": TABLE}
    yield {"session": session, "ssm": ssm, "secrets": secrets, "ddb": ddb, "env": env, "aws": aws}


def _answer(world: dict[str, Any], vm_id: str, role: str = "member") -> tuple[dict[str, Any], Any]:
    server = server_module.Server(world["env"], aws=world["session"])
    result = server.handle({"microvm_id": vm_id, "role": role, "attempt": 2, "slot": "base-0"})
    _, stats = DynamoDBLedger(world["ddb"], TABLE).load(FLEET)
    return result, stats["facts"][vm_id]


def test_no_recipe_is_a_failed_answer_saying_the_fleet_was_stopped(world) -> None:
    result, fact = _answer(world, "microvm-sin-receta")
    assert result == {"microvm_id": "microvm-sin-receta", "outcome": "failed"}
    assert not fact.ready and fact.attempt == 2 and fact.role == "member"
    assert "no recipe to serve the VM with: fleet_stopped" in (fact.reason or "")


def test_an_unreadable_recipe_is_a_failed_answer_with_its_reason(world) -> None:
    world["ssm"].put_parameter(Name=f"/rayito/agents/{FLEET}/recipe", Value="not a recipe", Type="SecureString")
    result, fact = _answer(world, "microvm-receta-rota", role="warm")
    assert result["outcome"] == "failed" and fact.role == "warm"
    assert "no recipe to serve the VM with: recipe_unreadable:" in (fact.reason or "")
    assert "not a recipe" not in (fact.reason or "")  # the reason, never the value


def test_a_missing_token_is_a_failed_answer_and_never_the_token(world) -> None:
    token = put_fleet_state(world["aws"], FLEET, SECRET)
    world["secrets"].delete_secret(SecretId=SECRET, ForceDeleteWithoutRecovery=True)
    result, fact = _answer(world, "microvm-sin-token")
    assert result["outcome"] == "failed"
    assert "access token cannot be read: secretsmanager:ResourceNotFoundException" in (fact.reason or "")
    assert token not in (fact.reason or "")


def test_a_recipe_read_once_is_kept_when_a_later_read_fails(world) -> None:
    put_fleet_state(world["aws"], FLEET, SECRET)
    server = server_module.Server(world["env"], aws=world["session"])
    assert isinstance(server.recipe.read(), Deployed)
    world["ssm"].put_parameter(Name=f"/rayito/agents/{FLEET}/recipe", Value="broken", Type="SecureString",
                               Overwrite=True)
    world["secrets"].delete_secret(SecretId=SECRET, ForceDeleteWithoutRecovery=True)
    server.handle({"microvm_id": "microvm-ultima", "role": "member", "attempt": 1})
    _, stats = DynamoDBLedger(world["ddb"], TABLE).load(FLEET)
    # the last recipe read stands in for the broken one: the answer is about the token, next
    assert "access token cannot be read" in (stats["facts"]["microvm-ultima"].reason or "")


# ------------------------------------------------------------------ the fleet source's reads


class _Refusing:
    """An SSM or Secrets Manager client whose calls fail with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def get_parameter(self, **_: Any) -> Any:
        self.calls += 1
        raise self.error

    def get_secret_value(self, **_: Any) -> Any:
        self.calls += 1
        raise self.error


def _client_error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "no"}}, operation)


@pytest.mark.parametrize("error, reason", [
    (_client_error("AccessDeniedException", "GetParameter"), "ssm:AccessDeniedException"),
    (_client_error("ThrottlingException", "GetParameter"), "ssm:ThrottlingException"),
    (EndpointConnectionError(endpoint_url="https://ssm.us-east-1.amazonaws.com"), "ssm:EndpointConnectionError"),
])
def test_a_refused_recipe_read_is_unreadable_with_the_service_code(error, reason) -> None:
    got = RecipeSource(_Refusing(error), FLEET).read()
    assert isinstance(got, Unreadable) and got.reason == reason


def test_a_missing_recipe_is_absent() -> None:
    assert isinstance(RecipeSource(_Refusing(_client_error("ParameterNotFound", "GetParameter")), FLEET).read(),
                      Absent)


def test_a_failed_token_reread_keeps_the_token_the_vms_carry() -> None:
    now = [0.0]

    class _Once:
        def __init__(self) -> None:
            self.calls = 0

        def get_secret_value(self, **_: Any) -> Any:
            self.calls += 1
            if self.calls > 1:
                raise _client_error("InternalServiceError", "GetSecretValue")
            return {"SecretString": TOKEN}

    client = _Once()
    source = TokenSource(client, SECRET, lambda: now[0])
    assert source.get() == TOKEN
    now[0] = 299.0
    assert source.get() == TOKEN and client.calls == 1  # within the TTL: not read again
    now[0] = 301.0
    assert source.get() == TOKEN and client.calls == 2  # read again, refused: the last one kept


def test_an_unreadable_or_empty_token_says_why() -> None:
    refused = TokenSource(_Refusing(_client_error("AccessDeniedException", "GetSecretValue")), SECRET, lambda: 0.0)
    got = refused.get()
    assert isinstance(got, Unreadable) and got.reason == "secretsmanager:AccessDeniedException"

    class _Empty:
        def get_secret_value(self, **_: Any) -> Any:
            return {"SecretString": ""}

    got = TokenSource(_Empty(), SECRET, lambda: 0.0).get()
    assert isinstance(got, Unreadable) and got.reason == "access_token_empty"

    class _NotAToken:  # a secret someone overwrote by hand: every VM started with it would refuse every client
        def get_secret_value(self, **_: Any) -> Any:
            return {"SecretString": "not a token"}

    got = TokenSource(_NotAToken(), SECRET, lambda: 0.0).get()
    assert isinstance(got, Unreadable) and got.reason == "access_token_invalid"


# ------------------------------------------------------------------ the reconciler's ask refused


def test_an_ask_lambda_refuses_is_told_and_asked_again_once_the_server_is_there(aws, monkeypatch) -> None:
    """The fleet's server function cannot be invoked (Lambda's 404: a deploy that has not made it
    yet): each ask is told (``api_error`` on Invoke), the base VM is not counted as serving, and
    the ask goes again; once the function answers, the VM serves. Counted from the emulator's VMs
    and the server's own record of what it served."""
    from .harness import deployed_fleet, serving

    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}, pending_seconds=2) as fleet:
        real = fleet.env["SERVER_FUNCTION"]
        fleet.env["SERVER_FUNCTION"] = "no-such-server"
        first = fleet.invoke(monkeypatch, timeout=20.0)
        refused = [e for e in first.events("api_error") if e.get("operation") == "Invoke"]
        assert refused and refused[0]["code"] == "ResourceNotFoundException", first.events("api_error")
        assert not first.events("serve_asked") and not serving(fleet) and not fleet.server.served
        assert len(refused) >= 2  # asked again within the tick, after SERVE_POLL_SECONDS
        fleet.env["SERVER_FUNCTION"] = real
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 1)
        assert len(serving(fleet)) == 1 and len(fleet.server.served) == 1


def test_a_reconciler_without_a_server_says_so_and_counts_no_vm_as_serving(aws, monkeypatch) -> None:
    """An environment without ``SERVER_FUNCTION`` (the construct always sets one): the base VM is
    started and its ask written down, but nothing is invoked; the tick says why, and the VM is
    not counted as serving."""
    from .harness import deployed_fleet, serving

    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2", "SERVER_FUNCTION": ""},
                        pending_seconds=2) as fleet:
        run = fleet.invoke(monkeypatch, timeout=20.0)
        (vm,) = fleet.live()
        told = run.events("serve_not_asked")
        assert told and {(e["microvm_id"], e["reason"]) for e in told} == {(vm["microvmId"], "this reconciler has no server")}
        assert not run.events("serve_asked") and not fleet.server.served and not serving(fleet)
        assert fleet.ledger_slots()["base-0"]["serve_asked_at"] is not None


def test_a_tick_whose_access_token_cannot_be_read_starts_nothing_and_says_why(aws, monkeypatch) -> None:
    """A recipe to keep, but the fleet's token gone (deleted by hand): a VM started now would
    carry a token no client has. The tick makes no MicroVMs call and says why."""
    from ..moto_server import client
    from .harness import deployed_fleet

    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        # This environment's recipe deployed as it is (the fixture wrote it), then the token deleted.
        fleet._environment, fleet._built_env = fleet.reconciler(monkeypatch), (dict(fleet.env), True)
        client("secretsmanager", aws).delete_secret(SecretId=fleet.env["ACCESS_TOKEN_SECRET"],
                                                    ForceDeleteWithoutRecovery=True)
        run = fleet.invoke(monkeypatch)
        why = "access_token_unreadable:secretsmanager:ResourceNotFoundException"
        assert run.result == {"fleet": fleet.fleet, "skipped": "access_token_unreadable", "reason": why}
        assert run.calls == {} and fleet.live() == []

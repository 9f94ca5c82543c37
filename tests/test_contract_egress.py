"""Contract from template to agent: the egress chokepoint as a deployed agent makes it.

From the assembly `make synth` writes (app.py): the egress budget table is made in moto from the
template's own properties, the image's template env (in the composed zip, handed to every process
by rayd) names that table in ``RAYITO_EGRESS_BUDGET_TABLE``, and its ``RAYITO_EGRESS_ENVELOPES``
declares the envelopes. The agent side is what an agent runs:
``BudgetClient.from_environment`` with its default store client (its timeouts, one attempt), the real
clock and its store-clock calibration, ``EmfRecorder`` attached, and the ``httpx`` adapter in front
of the next hop. The next hop counts what reached it; moto holds the bucket items; stdout holds the
EMF records with their units. Those are the evidence, not the recorder's or the client's counters.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from rayito_constructs.egress import BudgetClient, BudgetTransport, EgressDeferred, EmfRecorder

from . import contract_support as cs
from .moto_server import client as aws_client
from .moto_server import moto_server

SEARCH = "https://api.example.com/v1/search?region=eu"


@pytest.fixture
def agent(example_assembly, monkeypatch):
    outdir, template = example_assembly
    from rayito_constructs.egress.telemetry import METRICS_ENV

    image_env = cs.image_template_env(outdir, template)  # what rayd hands to every process
    declared = image_env["RAYITO_EGRESS_ENVELOPES"]
    recipe = {"name": "mi-agente", "egress": json.loads(declared)}
    (table_logical,) = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::DynamoDB::Table"
                        and r["Properties"].get("TableName") == image_env["RAYITO_EGRESS_BUDGET_TABLE"]]
    with moto_server() as aws:
        ddb = aws_client("dynamodb", aws)
        only = {"Resources": {table_logical: template["Resources"][table_logical]}}
        made = cs.provision(only, ddb, None, types=("AWS::DynamoDB::Table",))
        switch = image_env[METRICS_ENV]  # the metrics switch the fleet sets in its image
        for key, value in {METRICS_ENV: switch, "RAYITO_EGRESS_BUDGET_TABLE": made.names[table_logical],
                           "RAYITO_EGRESS_ENVELOPES": declared, "AWS_ENDPOINT_URL_DYNAMODB": aws,
                           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
            monkeypatch.setenv(key, value)
        yield {"recipe": recipe, "ddb": ddb, "table": made.names[table_logical]}


def _records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]


def _emf_totals(records: list[dict[str, Any]], target: str) -> dict[str, tuple[float, str]]:
    totals: dict[str, tuple[float, str]] = {}
    for record in records:
        if "_aws" not in record or record.get("target") != target or "reason" in record:
            continue
        for directive in record["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "Rayito/Egress"
            for metric in directive["Metrics"]:
                value, _ = totals.get(metric["Name"], (0.0, metric["Unit"]))
                totals[metric["Name"]] = (value + float(record[metric["Name"]]), metric["Unit"])
    return totals


def test_the_declared_envelope_holds_at_the_next_hop(agent) -> None:
    recipe = agent["recipe"]
    (envelope,) = [b for b in recipe["egress"]["budgets"] if b["target"].endswith("/v1/search?region")]
    out = io.StringIO()
    recorder = EmfRecorder(recipe["name"], out=out, background=False)
    budget = BudgetClient.from_environment(on_decision=recorder)  # the image's RAYITO_EGRESS_* variables
    reached: Counter[str] = Counter()

    def next_hop(request: httpx.Request) -> httpx.Response:
        reached[str(request.url)] += 1
        return httpx.Response(200, text="ok")

    deferred: Counter[str] = Counter()
    start = time.monotonic()
    with httpx.Client(transport=BudgetTransport(budget, transport=httpx.MockTransport(next_hop))) as http:
        for _ in range(envelope["burst"] + 6):
            try:
                assert http.get(SEARCH, timeout=30).status_code == 200
            except EgressDeferred as exc:
                # budget_empty, or limiter_unavailable when the store does not answer within the
                # default client's short timeouts (a loaded machine): it fails closed either way
                deferred[exc.deferral.reason] += 1
    elapsed = time.monotonic() - start
    assert set(deferred) <= {"budget_empty", "limiter_unavailable"}
    recorder.close()  # the last window is written
    records = _records(out)
    sent = reached[SEARCH]
    # the envelope at the next hop: its burst, plus what refilled while the loop ran (any machine speed)
    assert sent <= envelope["burst"] + envelope["rate_per_second"] * elapsed + 1
    assert sent + sum(deferred.values()) == envelope["burst"] + 6 and sum(deferred.values()) >= 1
    # the store holds the envelope's bucket (moto's side)
    items = agent["ddb"].scan(TableName=agent["table"], ConsistentRead=True)["Items"]
    assert sent == 0 or any("v1/search" in item["target"]["S"] for item in items)
    # EMF as CloudWatch reads it: what reached the next hop is what was granted, in Count
    totals = _emf_totals(records, "https://api.example.com/v1/search?region")
    assert totals.get("Granted", (0.0, "Count")) == (float(sent), "Count")
    assert totals["Deferrals"] == (float(sum(deferred.values())), "Count")
    assert totals["Requests"] == (float(sent + sum(deferred.values())), "Count")
    if "EnvelopeRate" in totals:
        assert totals["EnvelopeRate"][1] == "Count/Second"


def test_a_store_that_refuses_the_connection_sends_nothing(agent, monkeypatch) -> None:
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: every connection refused
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{closed.getsockname()[1]}")
        out = io.StringIO()
        recorder = EmfRecorder(agent["recipe"]["name"], out=out, background=False)
        budget = BudgetClient.from_environment(on_decision=recorder, calibrate=False)
        reached: Counter[str] = Counter()

        def next_hop(request: httpx.Request) -> httpx.Response:
            reached[str(request.url)] += 1
            return httpx.Response(200)

        with httpx.Client(transport=BudgetTransport(budget, transport=httpx.MockTransport(next_hop))) as http:
            with pytest.raises(EgressDeferred) as info:
                http.get(SEARCH, timeout=30)
    finally:
        closed.close()
    assert info.value.deferral.reason == "limiter_unavailable"
    assert reached == Counter()  # nothing reached the target without a token
    recorder.close()
    records = _records(out)
    by_reason = [r for r in records if "_aws" in r and r.get("reason") == "limiter_unavailable"]
    assert by_reason and all(m["Unit"] == "Count" for r in by_reason for d in r["_aws"]["CloudWatchMetrics"]
                             for m in d["Metrics"])

"""``FleetQueries``: the fleet's CloudWatch Logs Insights queries, saved in the account
(``AWS::Logs::QueryDefinition``) next to the log groups they read (docs/operations.md).

* ``admission-timeline`` (the reconciler's log): a run reconstructed as a timeline of admission
  events, one line per decision, oldest first: a slot queued, a VM asked for (the lease granted),
  deferred, running or parked, renewed by its successor, expired, ended, dead-lettered (the
  dispatcher essay, seed 004: "a timeline of admission events, not a list of messages").
* ``reconciler-problems`` (the reconciler's log): what needs a person: dead-lettered slots, API
  errors, lost leases, VMs that ended on their own, deadlines missed, newest first.
* ``egress-per-target`` and ``egress-deferrals`` (the MicroVMs' log, where each agent's
  ``EmfRecorder`` prints one line per decision): requests per envelope per minute joined with the
  trajectory step that sent them, and deferrals per envelope and reason (the egress essay, seed
  002: "log per-target request counts per window joined with the trajectory step").

The query texts are plain functions of the fleet's name, so they are tested against the log lines
the reconciler handler and ``EmfRecorder`` really print. Saved queries cost nothing; running one
is billed per GB scanned.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

from aws_cdk import aws_logs as logs
from constructs import Construct

from .model.names import fleet_name_problem

#: Admission events of the reconciler whose absence from a slot's history would be a problem.
PROBLEM_EVENTS = (
    "slot_dead_lettered", "api_error", "lease_lost", "vm_ended_unexpectedly", "admission_deadline_exceeded",
    "no_headroom_for_rolling_replacement", "stray_vm", "stray_terminated",
)
#: What ``EmfRecorder`` logs for each decision.
EGRESS_EVENTS = ("egress_granted", "egress_deferred")
#: Logs Insights returns at most 10,000 rows.
MAX_ROWS = 10_000


def _quoted(value: str) -> str:
    # Logs Insights string literals take JSON's escapes; a fleet name is [A-Za-z0-9_-] anyway.
    return json.dumps(value)


def _one_of(values: Sequence[str]) -> str:
    return "[" + ", ".join(_quoted(v) for v in values) + "]"


def admission_timeline(fleet: str) -> str:
    """Every decision of the fleet's reconciler, oldest first (one slot: add ``| filter slot = "base-0"``)."""
    return "\n".join([
        "fields @timestamp, message as event, slot, role, generation, microvm_id, reason, end_reason, operation, code",
        f"| filter fleet = {_quoted(fleet)} and ispresent(message)",
        "| sort @timestamp asc",
        f"| limit {MAX_ROWS}",
    ])


def reconciler_problems(fleet: str) -> str:
    """Dead letters, API errors, lost leases, early ends, missed deadlines and strays, newest first."""
    return "\n".join([
        "fields @timestamp, message as event, slot, microvm_id, operation, code, reason, end_reason, error_message",
        f"| filter fleet = {_quoted(fleet)} and message in {_one_of(PROBLEM_EVENTS)}",
        "| sort @timestamp desc",
        f"| limit {MAX_ROWS}",
    ])


def egress_per_target(fleet: str) -> str:
    """Requests per envelope per minute, by the trajectory step that sent them."""
    return "\n".join([
        f"filter fleet = {_quoted(fleet)} and event in {_one_of(EGRESS_EVENTS)}",
        "| stats count(*) as requests by bin(1m) as window, envelope, step",
        "| sort window desc",
        f"| limit {MAX_ROWS}",
    ])


def egress_deferrals(fleet: str) -> str:
    """Deferred requests per envelope and reason per five minutes, with the longest wait asked."""
    return "\n".join([
        f"filter fleet = {_quoted(fleet)} and event = {_quoted('egress_deferred')}",
        "| stats count(*) as deferrals, max(retry_after) as longest_retry_after by bin(5m) as window, envelope, reason",
        "| sort window desc",
        f"| limit {MAX_ROWS}",
    ])


class FleetQueries(Construct):
    """The fleet's saved Logs Insights queries, in the console folder ``rayito/<fleet>/``.

    :param fleet_name: the fleet.
    :param reconciler_log_group: the reconciler's log group (the admission timeline). Default:
        none (its queries are not saved).
    :param microvm_log_group_name: ``/aws/lambda-microvms/<image name>``, where the agents print
        their egress decisions. Default: none (the egress queries are not saved).
    """

    def __init__(self, scope: Construct, id: str, *, fleet_name: str,
                 reconciler_log_group: Optional[logs.ILogGroup] = None,
                 microvm_log_group_name: Optional[str] = None) -> None:
        problem = fleet_name_problem(fleet_name)
        if problem:  # it names the queries (1 to 255 characters) and is quoted in their text
            raise ValueError(f"fleet_name: {problem}")
        super().__init__(scope, id)
        self.fleet_name = fleet_name
        self.definitions: dict[str, logs.CfnQueryDefinition] = {}
        """The saved queries by their short name (``admission-timeline``...)."""
        if reconciler_log_group is not None:
            self._save("admission-timeline", "AdmissionTimeline", admission_timeline(fleet_name),
                       reconciler_log_group.log_group_name)
            self._save("reconciler-problems", "ReconcilerProblems", reconciler_problems(fleet_name),
                       reconciler_log_group.log_group_name)
        if microvm_log_group_name is not None:
            self._save("egress-per-target", "EgressPerTarget", egress_per_target(fleet_name), microvm_log_group_name)
            self._save("egress-deferrals", "EgressDeferrals", egress_deferrals(fleet_name), microvm_log_group_name)

    def query_name(self, short: str) -> str:
        """``rayito/<fleet>/<short>``, as the console lists it."""
        return f"rayito/{self.fleet_name}/{short}"

    def _save(self, short: str, id: str, query: str, log_group_name: str) -> None:
        self.definitions[short] = logs.CfnQueryDefinition(
            self, id, name=self.query_name(short), query_string=query, log_group_names=[log_group_name])

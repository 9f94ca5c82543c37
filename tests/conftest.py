"""Shared fixtures: paths, the example project and a factory for agent folders."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import pytest

# The CDK's built-in CloudFormation validation (cfn-lint in WebAssembly, on by default in
# aws-cdk-lib) costs every synth about 5 CPU-s in a new Node process and more than a quarter of a
# CDK test file's time; the session gate lints every distinct template the suite records with
# cfn-lint itself (template_gate.py), and tests/test_cdk_validation.py runs the CDK's validation on the
# templates app.py writes, its errors as errors. Set before aws_cdk is imported: jsii's Node process reads
# the variable when it synthesizes, from the environment it was started with.
os.environ.setdefault("CDK_VALIDATION", "false")

from .template_gate import BackgroundLinter  # noqa: E402

if TYPE_CHECKING:
    from .recipe_writer_helpers import CloudFormationEndpoint

# Quiet jsii's Node 20 banner for a plain `pytest` too (make test sets it already).
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mi-agente"


@pytest.fixture
def agent_folder(tmp_path: Path) -> Callable[..., Path]:
    """Make a Rayito agent folder (tests/projects.py): the product's format, the example's custom
    app, ``name``, and the tables of ``toml`` (text) and ``tables`` over that base; ``[egress]``
    and ``[stack]`` go to rayito-constructs.toml."""
    from .projects import write_project

    def make(toml: str | None = None, name: str = "agente", *, dockerfile: bool = True, **tables: object) -> Path:
        return write_project(tmp_path / name, name=name, toml=toml, tables=tables, dockerfile=dockerfile)

    return make


@pytest.fixture(scope="session")
def example_assembly(tmp_path_factory):
    """What `make synth` writes (app.py, cdk.json's context), once per session (per xdist worker):
    (the cloud assembly's folder, the stack's template). Read it; never change it."""
    from .contract_support import synth_example

    outdir = tmp_path_factory.mktemp("example-assembly") / "cdk.out"
    return outdir, synth_example(outdir)


@pytest.fixture(scope="module")
def aws() -> Iterator[str]:
    """moto in server mode, one per test module: its endpoint URL (tests/reconciler has its own,
    one per session, for the deployed fleets its modules share)."""
    from .moto_server import moto_server

    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def stores():
    """moto in server mode for the module, and a proxy in front of it that counts requests and
    answers chosen operations with AWS's errors: ``(moto's endpoint, the proxy)``."""
    from .moto_server import moto_server
    from .recipe_writer_helpers import FaultProxy

    with moto_server() as endpoint:
        proxy = FaultProxy(int(endpoint.rsplit(":", 1)[1]))
        yield endpoint, proxy
        proxy.close()


@pytest.fixture(scope="module")
def cfn(tmp_path_factory) -> Iterator[CloudFormationEndpoint]:
    """CloudFormation's response endpoint for custom resources (recipe_writer_helpers), one per
    test module."""
    from .recipe_writer_helpers import CloudFormationEndpoint

    endpoint = CloudFormationEndpoint(tmp_path_factory.mktemp("cfn"))
    yield endpoint
    endpoint.close()


@pytest.fixture
def snapshot_json(snapshot):
    """syrupy JSON snapshots with asset hashes neutralized."""
    from syrupy.extensions.json import JSONSnapshotExtension

    from .cdk_helpers import neutralize

    return snapshot.with_defaults(extension_class=JSONSnapshotExtension, matcher=neutralize)


# Every template a test synthesizes passes cfn-lint and keeps the IAM invariants of
# tests/iam_invariants.py (the launcher never writes the recipe, wildcards only where the
# allow-list says, PassRole on roles with iam:PassedToService): Template.from_stack is wrapped to
# keep each one, and the session fails at the end if any has a finding (cfn-lint's W3005, the
# DependsOn CDK adds on purpose, aside). Templates taken from a stack object also keep the
# operations invariants of tests/monitoring_invariants.py: below a fleet, no alarm on a custom
# metric while metrics are off, and every alarm carries the fleet's alarm_actions when it has any.
_TEMPLATES: dict[str, dict] = {}
_FLEETS: dict[str, list] = {}
_LINTER = BackgroundLinter()


def record_template(name: str, template: dict, fleets: list | None = None) -> None:
    """Put one synthesized template under the session gate (``fleets``: what
    ``monitoring_invariants.expectations`` read from its stack)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    key = f"{test} {name}#{len(_TEMPLATES)}"
    _TEMPLATES[key] = template
    _LINTER.submit(template)  # cfn-lint starts now, beside the tests (tests/template_gate.py)
    if fleets:
        _FLEETS[key] = fleets


def _share_botocore_data_files() -> None:
    """botocore parses its JSON data files (endpoints, partitions, each service's model: about
    1.5 MB) again for every new session, and the handlers under test make a session per cold start,
    as they do in Lambda: hundreds of sessions per test file, a third of the CPU of the handler
    tests. One parse per worker process is kept here and handed to every session, as botocore
    itself hands one session's loaded data to all of that session's clients. Only the parsing is
    shared: each session still searches its own paths (the reconciler's bundled model first), so
    what a client loads is what it would load without this."""
    from botocore import loaders

    original = loaders.JSONFileLoader.load_file
    parsed: dict[str, object] = {}

    def load_file(self, file_path):
        stamps = []
        for ext in loaders._JSON_OPEN_METHODS:  # .json, .json.gz: what botocore itself tries
            try:
                stamps.append((ext, os.stat(file_path + ext).st_mtime_ns))
            except OSError:
                pass
        if not stamps:
            return original(self, file_path)
        key = (file_path, tuple(stamps))
        if key not in parsed:
            parsed[key] = original(self, file_path)
        return parsed[key]

    loaders.JSONFileLoader.load_file = load_file

    # Each new session's loader also lists every service folder of its search paths again (a
    # listdir and a stat per service and version: 400-odd services), before a client loads its
    # model: 3% of the suite's CPU. One listing per worker is kept for the same folders, with the
    # same entries (the folders' modification times are part of the key), and a copy is handed
    # to each loader, which still caches it per instance as botocore does (instance_cache).
    listing = loaders.Loader.list_available_services
    listed: dict[tuple, list[str]] = {}

    def list_available_services(self, type_name):
        locations = tuple(self._potential_locations())
        try:
            stamps = tuple(os.stat(path).st_mtime_ns for path in locations)
        except OSError:
            return listing(self, type_name)
        key = (locations, stamps, type_name, type(self.file_loader))
        if key not in listed:
            listed[key] = listing(self, type_name)
        return list(listed[key])

    loaders.Loader.list_available_services = loaders.instance_cache(list_available_services)


#: The files that keep a worker longest, longest first (seconds of one worker, `make test` on this
#: 2-core machine under load, measured 2026-12-07: 85-160 s each for the first eight, the Lambda
#: processes of the contract tests, the handler's scenarios against moto, the verify world's
#: deploy; 40-80 s for the next ones). ``--dist loadfile`` with ``--no-loadscope-reorder`` (the
#: Makefile) hands files out in collection order, so these go first and the last file to start is
#: a short one (xdist's default order is by count of tests: a long file with few tests started last
#: and ended the run alone). A stale list only orders; it changes nothing a test sees (each file
#: keeps its own order).
LONGEST_FILES = (
    "tests/reconciler/test_contract.py", "tests/reconciler/test_handler.py", "tests/reconciler/test_reconcile.py",
    "tests/test_verify.py", "tests/test_fleet_teardown_handler.py", "tests/test_fleet_product.py",
    "tests/reconciler/test_budget_admission.py", "tests/reconciler/test_room_for_successors.py", "tests/test_app.py",
    "tests/test_product_iam.py", "tests/test_fleet.py", "tests/test_monitoring_runtime.py",
    "tests/reconciler/test_overtime.py", "tests/reconciler/test_construct.py", "tests/test_policies.py",
    "tests/reconciler/test_letters_and_lists.py", "tests/reconciler/test_short_lifetimes.py",
    "tests/reconciler/test_faults.py", "tests/test_verify_scenarios.py", "tests/reconciler/test_slow_calls.py",
    "tests/reconciler/test_room.py", "tests/test_contract_recipe_writer.py", "tests/testing/test_rayd.py",
    "tests/test_names.py", "tests/test_recipe.py", "tests/reconciler/test_parking_assumed.py", "tests/test_monitoring.py",
    "tests/reconciler/test_store_failures.py", "tests/test_egress.py", "tests/reconciler/test_parking_looks.py",
    "tests/test_fleet_teardown_paths.py", "tests/test_fleet_teardown.py", "tests/testing/test_rayd_cli.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONGEST_FILES)))  # stable


def pytest_configure(config) -> None:
    from aws_cdk.assertions import Template

    _share_botocore_data_files()

    original = Template.from_stack  # a bound classmethod

    def from_stack(cls, stack, *args, **kwargs):
        from .monitoring_invariants import expectations

        template = original(stack, *args, **kwargs)
        record_template(stack.node.path, template.to_json(), expectations(stack))
        return template

    Template.from_stack = classmethod(from_stack)


def _lint(templates: dict[str, dict]) -> tuple[int, list[str]]:
    """cfn-lint and the IAM invariants over distinct templates: (how many, findings)."""
    from .iam_invariants import iam_violations
    from .monitoring_invariants import violations as operations_violations

    findings: list[str] = []
    iam_findings: list[str] = []
    ops_findings = [f"{name}: OPS {v}" for name, fleets in _FLEETS.items() if name in templates
                    for v in operations_violations(templates[name], fleets)]
    seen: set[str] = set()
    for name, template in templates.items():
        text = _LINTER.submit(template)  # already submitted when recorded: this only finds it
        if text in seen:  # the same template synthesized twice (from_stack, then nag) is linted once
            continue
        seen.add(text)
        findings.extend(f"{name}: {finding}" for finding in _LINTER.findings(text))
        iam_findings.extend(f"{name}: IAM {v}" for v in iam_violations(template))
    _LINTER.close()
    return len(seen), findings + iam_findings + ops_findings


# Under pytest-xdist (make test runs two workers) each worker lints the templates its own tests
# synthesized and hands the result to the controller in its workeroutput; the controller adds them
# up and fails the run. Without xdist the single process does both.
_FROM_WORKERS: list[dict] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    gate = getattr(node, "workeroutput", {}).get("template_gate")
    if gate is not None:
        _FROM_WORKERS.append(gate)


def _save_coverage() -> None:
    """An xdist worker's coverage data, written now rather than at its exit: the controller gives
    workers 10 s to exit (xdist's EXIT_TIMEOUT) and then kills them, and a killed worker's data
    (written at exit) is lost. Exits took 4-10 s; a loaded machine's run failed the floor with
    egress at 90.1 % of lines (100 % when rerun), most likely so (not reproduced). Whatever runs
    after this is saved at exit, as before."""
    try:
        import coverage
    except ImportError:  # pragma: no cover - the dev requirements install coverage
        return
    current = coverage.Coverage.current()
    if current is not None:
        current.save()


def pytest_sessionfinish(session, exitstatus) -> None:
    worker = hasattr(session.config, "workerinput")
    if worker:
        _save_coverage()
    gates = list(_FROM_WORKERS)
    if not (_TEMPLATES and exitstatus == 0):
        _LINTER.close()  # a failed run: its findings would not be read
    else:
        distinct, findings = _lint(_TEMPLATES)
        gates.append({"distinct": distinct, "findings": findings, "fleets": sum(len(f) for f in _FLEETS.values()),
                      "with_actions": sum(f["actions"] > 0 for fl in _FLEETS.values() for f in fl)})
    if worker:
        if gates:
            session.config.workeroutput["template_gate"] = gates[-1]
        return
    if not gates:
        return
    distinct = sum(g["distinct"] for g in gates)
    findings = [f for g in gates for f in g["findings"]]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        iam = sum(1 for f in findings if ": IAM " in f)
        ops = sum(1 for f in findings if ": OPS " in f)
        reporter.write_line(
            f"cfn-lint: {distinct} distinct templates synthesized by the tests (per worker), "
            f"{len(findings) - iam - ops} findings; IAM invariants: {iam} violations; operations invariants: "
            f"{ops} violations over {sum(g.get('fleets', 0) for g in gates)} fleets, "
            f"{sum(g.get('with_actions', 0) for g in gates)} with alarm actions"
        )
    if findings:
        for finding in findings:
            reporter.write_line(finding) if reporter else print(finding)
        session.exitstatus = 1

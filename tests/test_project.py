"""The project model: every option, default and limit of the product page, and how errors read."""

from __future__ import annotations

import json

import pytest

from rayito_constructs import AgentProject, ProjectError
from rayito_constructs.options import max_concurrency_limit

from .conftest import EXAMPLE


def load_error(folder, **overrides) -> list[str]:
    with pytest.raises(ProjectError) as info:
        AgentProject.load(folder, **overrides)
    return [p.message for p in info.value.problems]


def test_defaults_without_a_project_file(agent_folder) -> None:
    project = AgentProject.load(agent_folder(None, name="solo"))
    assert project.name == "solo"
    assert project.target == "microvm"
    assert project.serve.model_dump() == {"max_concurrency": 1, "queue_max": 0, "queue_timeout_seconds": 30}
    assert project.scaling.model_dump() == {
        "min_vms": 1,
        "max_vms": 1,
        "warm_vms": 0,
        "sessions": "shared",
        "scale_in_after_seconds": 900,
        "idle": None,
    }
    assert project.image.memory_mib == 2048
    assert project.scaling_source == "default"
    assert set(project.sources.values()) == {"default"}
    assert [w.code for w in project.warnings] == ["no_project_file"]
    assert project.recipe_parameter_name == "/rayito/agents/solo/recipe"


def test_example_uses_every_option() -> None:
    project = AgentProject.load(EXAMPLE)
    assert project.name == "mi-agente"
    assert project.scaling_source == "project"
    fleet_options = [
        "max_concurrency", "queue_max", "queue_timeout_seconds", "min_vms", "max_vms", "warm_vms",
        "sessions", "scale_in_after_seconds", "idle", "memory_mib",
    ]
    assert {k: project.sources[k] for k in fleet_options} == {k: "project" for k in fleet_options}
    assert project.scaling.idle == 600
    assert project.secret_env == ("MODEL_API_KEY",)
    assert [g.name for g in project.gateways] == ["model"]


def test_name_defaults_to_the_folder_name(agent_folder) -> None:
    folder = agent_folder("[scaling]\nmax_vms = 2\n", name="mi-agente")
    assert AgentProject.load(folder).name == "mi-agente"
    assert AgentProject.load(str(folder) + "/").name == "mi-agente"


def test_explicit_beats_project_beats_default(agent_folder) -> None:
    folder = agent_folder("[scaling]\nmax_vms = 3\n")
    project = AgentProject.load(folder, min_vms=2)
    assert (project.scaling.min_vms, project.sources["min_vms"]) == (2, "explicit")
    assert (project.scaling.max_vms, project.sources["max_vms"]) == (3, "project")
    assert (project.scaling.warm_vms, project.sources["warm_vms"]) == (0, "default")
    assert project.scaling_source == "explicit"
    assert AgentProject.load(folder).scaling_source == "project"


# Each limit at its boundary (accepted) and just past it (rejected with the page's wording).
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_vms": 65}, "max_vms: 65 is above the limit of 64"),
        ({"max_vms": 0}, "max_vms: 0 is below the minimum of 1"),
        ({"min_vms": -1}, "min_vms: -1 is below the minimum of 0"),
        ({"warm_vms": -1}, "warm_vms: -1 is below the minimum of 0"),
        ({"queue_max": 257}, "queue_max: 257 is above the limit of 256"),
        ({"queue_max": -1}, "queue_max: -1 is below the minimum of 0"),
        ({"queue_timeout_seconds": 901}, "queue_timeout_seconds: 901 seconds is above the limit of 900 seconds (15m)"),
        ({"queue_timeout_seconds": 0}, "queue_timeout_seconds: 0 seconds is below the minimum of 1 second"),
        ({"scale_in_after_seconds": 59}, "scale_in_after_seconds: 59 seconds is below the minimum of 60 seconds (1m)"),
        ({"scale_in_after_seconds": 28_801}, "scale_in_after_seconds: 28801 seconds is above the limit of 28800 seconds (8h)"),
        ({"idle": 59}, "idle: 59 seconds is below the minimum of 60 seconds (1m); none turns suspension off"),
        ({"idle": 28_801}, "idle: 28801 seconds is above the limit of 28800 seconds (8h); none turns suspension off"),
        ({"max_concurrency": 0}, "max_concurrency: 0 is below the minimum of 1"),
        ({"sessions": "solo"}, "sessions: 'solo' is not one of 'shared' or 'dedicated'"),
        ({"memory_mib": 3000}, "memory_mib: 3000 is not a MicroVM size class (512, 1024, 2048, 4096, 8192 MiB)"),
        ({"min_vms": 3, "max_vms": 2}, "min_vms: 3 is above max_vms (2)"),
        ({"min_vms": 1, "max_vms": 3, "warm_vms": 3}, "warm_vms: 3 is above the limit of 2 (max_vms - min_vms = 3 - 1)"),
        ({"target": "lambda"}, "target: 'lambda' is not one of 'microvm', 'agentcore'"),
    ],
)
def test_limit_just_past(agent_folder, overrides, message) -> None:
    assert message in load_error(agent_folder(None), **overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_vms": 64},
        {"max_vms": 1},
        {"min_vms": 0},
        {"queue_max": 256},
        {"queue_max": 0},
        {"queue_timeout_seconds": 900},
        {"queue_timeout_seconds": 1},
        {"scale_in_after_seconds": 60},
        {"idle": 60},
        {"min_vms": 1, "max_vms": 3, "warm_vms": 2},
        {"min_vms": 2, "max_vms": 2},
        {"sessions": "dedicated"},
        {"memory_mib": 512},
        {"memory_mib": 8192},
    ],
)
def test_limit_at_boundary(agent_folder, overrides) -> None:
    project = AgentProject.load(agent_folder(None), **overrides)
    for key, value in overrides.items():
        section = {"memory_mib": project.image, "queue_max": project.serve, "queue_timeout_seconds": project.serve}
        assert getattr(section.get(key, project.scaling), key) == value


@pytest.mark.parametrize(("memory", "limit"), [(512, 7), (1024, 7), (2048, 7), (4096, 15), (8192, 31)])
def test_max_concurrency_follows_memory(agent_folder, memory, limit) -> None:
    assert max_concurrency_limit(memory) == limit
    folder = agent_folder(None)
    assert AgentProject.load(folder, memory_mib=memory, max_concurrency=limit).serve.max_concurrency == limit
    (message,) = load_error(folder, memory_mib=memory, max_concurrency=limit + 1)
    assert message.startswith(f"max_concurrency: {limit + 1} is above the limit of {limit} for {memory} MiB")


def test_dedicated_sessions_serve_one_session_per_vm(agent_folder) -> None:
    (message,) = load_error(agent_folder(None), sessions="dedicated", max_concurrency=2)
    assert message.startswith("max_concurrency: 2 is above the limit of 1 with sessions = 'dedicated'")


def test_every_problem_at_once_and_no_wrong_types(agent_folder) -> None:
    folder = agent_folder(
        """
        [serve]
        max_concurrency = "2"
        [scaling]
        max_vm = 3
        min_vms = 1.5
        sessions = true
        [image]
        memory_mib = 4096
        [sevre]
        """
    )
    messages = load_error(folder, max_vms=65)
    assert sorted(messages) == sorted([
        "sevre: unknown key in rayito-agent.toml; did you mean 'serve'?",
        "max_concurrency: '2' is not a whole number",
        "scaling.max_vm: unknown key in [scaling]; did you mean 'max_vms'?",
        "min_vms: 1.5 is not a whole number",
        "max_vms: 65 is above the limit of 64",
        "sessions: true is not one of 'shared' or 'dedicated'",
    ])


def test_bool_is_not_a_number(agent_folder) -> None:
    assert load_error(agent_folder("[scaling]\nmin_vms = true\n")) == ["min_vms: true is not a whole number"]


def test_unknown_override_suggests_the_nearest(agent_folder) -> None:
    assert load_error(agent_folder(None), max_vm=3) == ["max_vm: unknown option; did you mean 'max_vms'?"]


def test_durations(agent_folder) -> None:
    folder = agent_folder('[scaling]\nidle = "15m"\nscale_in_after_seconds = "1h"\n')
    project = AgentProject.load(folder)
    assert (project.scaling.idle, project.scaling.scale_in_after_seconds) == (900, 3600)
    assert AgentProject.load(folder, idle="none").scaling.idle is None
    assert load_error(folder, idle="soon") == [
        "idle: 'soon' is not a duration: a whole number of seconds (90) or a number with a unit "
        "(90s, 10m, 1h), or none"
    ]


def test_explicit_secret_env_is_rejected_file_env_is_warned(agent_folder) -> None:
    folder = agent_folder('[env]\nGITHUB_TOKEN = "ghp_x"\nAUTH_MODE = "oidc"\n')
    project = AgentProject.load(folder)
    assert project.env == {"AUTH_MODE": "oidc", "GITHUB_TOKEN": "ghp_x"}  # stored as is
    assert [(w.code, w.message.split(" ")[1]) for w in project.warnings] == [("env_looks_secret", "GITHUB_TOKEN")]
    (message,) = load_error(folder, env={"DB_PASS": "hunter2"})
    assert message == (
        "env: DB_PASS looks like a secret (it has a PASS segment); pass it with "
        "--secret-env DB_PASS=<secret> so the recipe keeps only its name"
    )
    explicit = AgentProject.load(folder, env={"AUTHOR_NAME": "ana"}, secret_env={"DB_PASS": "hunter2"})
    assert explicit.env["AUTHOR_NAME"] == "ana" and explicit.sources["env"] == "explicit"
    assert explicit.secret_env == ("DB_PASS",)
    assert "hunter2" not in explicit.model_dump_json()


def test_a_name_is_plain_or_secret_not_both(agent_folder) -> None:
    folder = agent_folder('secret_env = ["LOG_LEVEL"]\n[env]\nLOG_LEVEL = "info"\n')
    assert load_error(folder) == ["secret_env: LOG_LEVEL is also in env; a variable is either plain or secret"]


def test_agentcore_has_no_fleet(agent_folder) -> None:
    folder = agent_folder('target = "agentcore"\n[scaling]\nmax_vms = 3\n[image]\nmemory_mib = 4096\n')
    project = AgentProject.load(folder)
    assert [w.code for w in project.warnings] == ["option_not_supported"]
    assert "max_vms = 3 in [scaling] is ignored" in project.warnings[0].message
    assert project.scaling.max_vms == 1 and not project.has_fleet
    (message,) = load_error(folder, warm_vms=1)
    assert message.startswith("warm_vms: option_not_supported: 1 given")
    assert AgentProject.load(agent_folder(None), target="agentcore").target == "agentcore"


def test_names_that_cannot_name_a_fleet(agent_folder, tmp_path) -> None:
    (message,) = load_error(agent_folder(None, name="mi agente"))
    assert message.startswith("name: the folder name 'mi agente' must be 1 to 64 letters (A-Z, a-z), digits, '-' or '_'")
    assert "for example 'mi-agente'" in message and 'set name = "..." in rayito-agent.toml' in message
    assert AgentProject.load(agent_folder('name = "otro"\n', name="mi agente")).name == "otro"


def test_dot_folder_is_named_after_the_folder(agent_folder, monkeypatch) -> None:
    folder = agent_folder(None, name="mi-agente")
    monkeypatch.chdir(folder)
    assert AgentProject.load(".").name == "mi-agente"
    monkeypatch.chdir(folder / "..")
    assert AgentProject.load("mi-agente/..").name == folder.parent.name


def test_not_a_folder(tmp_path) -> None:
    assert load_error(tmp_path / "nope") == [f"folder: {str(tmp_path / 'nope')!r} is not a directory"]


def test_bad_toml(agent_folder) -> None:
    (message,) = load_error(agent_folder("[scaling\n"))
    assert message.startswith("rayito-agent.toml: not valid TOML")


def test_gateways_validated(agent_folder) -> None:
    folder = agent_folder('[[gateways]]\npreset = "bedrock"\nupstrem = "x"\n[[gateways]]\nname = "a"\n[[gateways]]\nname = "a"\n')
    assert load_error(folder) == [
        "gateways[0].name: is required",
        "gateways[0].upstrem: unknown key; did you mean 'upstream'?",
        "gateways: 'a' is declared more than once",
    ]


def test_egress_budgets(agent_folder) -> None:
    folder = agent_folder(
        """
        [egress]
        default_rate = "10/second"
        [[egress.budgets]]
        target = "https://API.Example.com:443/v1/"
        rate = "60/minute"
        burst = 3
        """
    )
    egress = AgentProject.load(folder).egress
    assert egress.budgets[0].target == "https://api.example.com/v1" and egress.budgets[0].rate_per_second == 1.0
    bad = agent_folder('[[egress.budgets]]\ntarget = "https://x.org"\nrate = "sixty"\nburst = 0\n[[egress.budgets]]\nrate = 1\n', name="bad")
    assert sorted(load_error(bad)) == sorted([
        "budgets[0].rate: 'sixty' is not a rate such as 60/minute or 10/second",
        "budgets[0].burst: 0 is below the minimum of 1",
        "budgets[1].target: is required",
    ])


# ---------------------------------------------------------------------------- the rules live in the model

from rayito_constructs import GatewayOptions, ScalingOptions, ServeOptions  # noqa: E402
from rayito_constructs.options import EgressOptions, ImageOptions  # noqa: E402


def problems_of(call) -> list[str]:
    with pytest.raises(ProjectError) as info:
        call()
    assert isinstance(info.value, ValueError)
    return [p.message for p in info.value.problems]


@pytest.mark.parametrize(
    "make",
    [
        lambda: ScalingOptions(min_vms=3, max_vms=1),
        lambda: ScalingOptions.model_validate({"min_vms": 3, "max_vms": 1}),
        lambda: ScalingOptions.model_validate_json('{"min_vms": 3, "max_vms": 1}'),
        lambda: ScalingOptions(max_vms=1).model_copy(update={"min_vms": 3}),
        lambda: AgentProject(name="x", scaling={"min_vms": 3, "max_vms": 1}),
        lambda: AgentProject(name="x").model_copy(update={"scaling": {"min_vms": 3, "max_vms": 1}}),
        lambda: AgentProject.from_recipe({"version": 1, "name": "x", "scaling": {"min_vms": 3, "max_vms": 1}}),
        lambda: AgentProject.from_dict({"scaling": {"min_vms": 3, "max_vms": 1}}, name="x"),
    ],
    ids=["init", "model_validate", "model_validate_json", "model_copy", "project", "project_copy", "from_recipe", "from_dict"],
)
def test_every_way_of_building_checks_min_above_max(make) -> None:
    assert problems_of(make) == ["min_vms: 3 is above max_vms (1)"]


def test_the_issues_project_does_not_construct() -> None:
    """``AgentProject(...)`` built directly used to skip every cross-option limit."""
    messages = problems_of(lambda: AgentProject(name="x", scaling={"min_vms": 3, "max_vms": 1, "warm_vms": 5}))
    assert messages == [
        "min_vms: 3 is above max_vms (1)",
        "warm_vms: 5 is above the limit of 0 (max_vms - min_vms = 1 - 3)",
    ]


# The same input through the loader (overrides) and through the model (constructor): same lines.
SAME_RULE_CASES = [
    {"max_vms": 65},
    {"min_vms": -1},
    {"idle": 30},
    {"idle": "soon"},
    {"queue_timeout_seconds": 0},
    {"scale_in_after_seconds": "none"},
    {"memory_mib": 3000},
    {"sessions": "solo"},
    {"min_vms": 2, "max_vms": 1},
    {"min_vms": 1, "max_vms": 2, "warm_vms": 2},
    {"memory_mib": 2048, "max_concurrency": 8},
    {"sessions": "dedicated", "max_concurrency": 2},
    {"name": "my agent"},
    {"name": ".."},
    {"name": "a" * 65},
    {"env": {"1BAD": "x"}},
    {"env": {"LONG": "x" * 4097}},
    {"allow_out": ["https://a.com"]},
    {"target": "agentcore", "max_vms": 3},
]
_SECTION = {
    "max_vms": "scaling", "min_vms": "scaling", "warm_vms": "scaling", "idle": "scaling", "sessions": "scaling",
    "scale_in_after_seconds": "scaling", "queue_timeout_seconds": "serve", "max_concurrency": "serve",
    "memory_mib": "image",
}


def as_arguments(overrides: dict) -> dict:
    arguments: dict = {"name": overrides.get("name", "agente")}
    for key, value in overrides.items():
        if key in _SECTION:
            arguments.setdefault(_SECTION[key], {})[key] = value
        elif key == "allow_out":
            arguments["egress"] = {"allow": value}
        elif key != "name":
            arguments[key] = value
    return arguments


@pytest.mark.parametrize("overrides", SAME_RULE_CASES, ids=lambda o: ",".join(o))
def test_loader_and_model_say_the_same(agent_folder, overrides) -> None:
    from_loader = load_error(agent_folder(None), **overrides)
    from_model = problems_of(lambda: AgentProject(**as_arguments(overrides)))
    assert from_loader == from_model


def test_unknown_arguments_are_refused_with_the_nearest() -> None:
    assert problems_of(lambda: AgentProject(name="x", nmae="y")) == ["nmae: unknown option; did you mean 'name'?"]
    assert problems_of(lambda: ScalingOptions(max_vm=3)) == ["scaling.max_vm: unknown key in [scaling]; did you mean 'max_vms'?"]
    assert problems_of(lambda: AgentProject(name="x", scaling={"max_vm": 3})) == [
        "scaling.max_vm: unknown key in [scaling]; did you mean 'max_vms'?"
    ]


def test_model_copy_checks_and_marks_what_changed() -> None:
    project = AgentProject.load(EXAMPLE)
    bigger = project.model_copy(update={"scaling": project.scaling.model_copy(update={"max_vms": 5})})
    assert bigger.scaling.max_vms == 5 and bigger.sources["max_vms"] == "explicit"
    assert bigger.sources["min_vms"] == "project" and bigger.scaling_source == "explicit"
    assert problems_of(lambda: project.model_copy(update={"name": "mi agente"}))[0].startswith("name: 'mi agente' must be")
    assert problems_of(lambda: project.model_copy(update={"serve": ServeOptions(max_concurrency=8), "image": ImageOptions(memory_mib=2048)}))[0].startswith(
        "max_concurrency: 8 is above the limit of 7 for 2048 MiB"
    )
    assert project.model_copy(update={"image": ImageOptions(memory_mib=2048)}).image.memory_mib == 2048
    assert project.model_copy().model_dump() == project.model_dump()


def test_direct_construction_reports_explicit_sources() -> None:
    project = AgentProject(name="bot", scaling=ScalingOptions(max_vms=3), serve=ServeOptions(queue_max=2))
    assert project.sources["max_vms"] == "explicit" and project.sources["queue_max"] == "explicit"
    assert project.sources["min_vms"] == "default" and project.scaling_source == "explicit"
    assert AgentProject(name="bot").scaling_source == "default"


def test_direct_construction_checks_env_secrets_and_gateways() -> None:
    assert problems_of(lambda: AgentProject(name="x", env={"A": "1"}, secret_env=["A"])) == [
        "secret_env: A is also in env; a variable is either plain or secret"
    ]
    assert problems_of(lambda: AgentProject(name="x", env={"A": 1})) == ["env.A: 1 is not a string (quote it)"]
    assert problems_of(lambda: AgentProject(name="x", env={f"V{i}": "" for i in range(101)})) == [
        "env: 101 variables is above the limit of 100"
    ]
    assert problems_of(lambda: AgentProject(name="x", gateways=[GatewayOptions(name="g"), GatewayOptions(name="g")])) == [
        "gateways: 'g' is declared more than once"
    ]
    assert problems_of(lambda: AgentProject(name="x", save_recipe="yes")) == ["save_recipe: 'yes' is not true or false"]


def test_agentcore_refuses_fleet_options_however_built() -> None:
    (message,) = problems_of(lambda: AgentProject(name="x", target="agentcore", scaling=ScalingOptions(max_vms=3)))
    assert message.startswith("max_vms: option_not_supported: 3 given")
    assert AgentProject(name="x", target="agentcore").has_fleet is False


def test_egress_hosts_are_checked_in_the_model() -> None:
    assert EgressOptions(allow=("API.example.com",)).allow == ("api.example.com",)
    (message,) = problems_of(lambda: EgressOptions(allow=("https://a.com",)))
    assert message == "allow: 'https://a.com' is a URL, not a host: give the host alone ('a.com')"


# ---------------------------------------------------------------------------- names


ACCEPTED_NAMES = ["a", "A" * 64, "my_agent", "mi-agente", "-", "_", "9lives", "a-b_c", "__init__"]
REJECTED_NAMES = [
    "", "a" * 65, "my agent", "agénte", "ａｇｅｎｔ", "日本", "a.b", ".", "..", "x\n", "x/y", "tab\tname", "x;y",
]


@pytest.mark.parametrize("name", ACCEPTED_NAMES)
def test_names_that_name_a_fleet(agent_folder, name) -> None:
    from rayito_constructs.names import is_stack_name

    project = AgentProject.load(agent_folder(None), name=name)
    assert project.name == name and project.recipe_parameter_name == f"/rayito/agents/{name}/recipe"
    assert is_stack_name(project.stack_name) and len(project.stack_name) <= 128


@pytest.mark.parametrize("name", REJECTED_NAMES)
def test_names_that_cannot_name_a_fleet_from_any_source(agent_folder, name) -> None:
    (explicit,) = load_error(agent_folder(None), name=name)
    assert explicit.startswith(f"name: {name!r} ")
    in_file = agent_folder(f"name = {json.dumps(name)}\n", name="from-file")
    assert load_error(in_file) == [explicit]
    assert problems_of(lambda: AgentProject(name=name)) == [explicit]


@pytest.mark.parametrize("folder_name", ["mi agente", "agénte", "a" * 65, "x.y"])
def test_a_folder_name_that_cannot_name_a_fleet(agent_folder, folder_name) -> None:
    (message,) = load_error(agent_folder(None, name=folder_name))
    assert message.startswith(f"name: the folder name {folder_name!r} ")
    assert message.endswith('set name = "..." in rayito-agent.toml (or pass --name / -c name=...)')
    named = AgentProject.load(agent_folder('name = "fine"\n', name=folder_name))
    assert named.name == "fine"


def test_the_root_folder_has_no_name() -> None:
    (message,) = load_error("/")
    assert message.startswith("name: the folder name '' must be 1 to 64")


# ---------------------------------------------------------------------------- the project file


def test_a_file_that_is_not_utf8(agent_folder) -> None:
    folder = agent_folder(None)
    (folder / "rayito-agent.toml").write_bytes(b'name = "x"\n# caf\xe9\n')
    assert load_error(folder) == ["rayito-agent.toml: not UTF-8 text (byte 0xe9 on line 2); save it as UTF-8"]


def test_a_byte_order_mark_is_not_content(agent_folder) -> None:
    folder = agent_folder(None)
    (folder / "rayito-agent.toml").write_bytes("\ufeffname = \"bom\"\n".encode("utf-8"))
    assert AgentProject.load(folder).name == "bom"


def test_no_dockerfile_and_no_project_file_warn(tmp_path) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "rayito-agent.toml").mkdir()  # a folder of that name is not the file
    project = AgentProject.load(folder)
    assert [w.code for w in project.warnings] == ["no_project_file", "no_dockerfile"]
    assert AgentProject.load(folder, target="agentcore").warnings[-1].code == "no_project_file"


def test_overrides_that_contradict_the_file(agent_folder) -> None:
    folder = agent_folder("[scaling]\nmin_vms = 1\nmax_vms = 3\nwarm_vms = 2\n")
    assert load_error(folder, max_vms=2) == ["warm_vms: 2 is above the limit of 1 (max_vms - min_vms = 2 - 1)"]
    assert load_error(folder, min_vms=4) == [
        "min_vms: 4 is above max_vms (3)",
        "warm_vms: 2 is above the limit of 0 (max_vms - min_vms = 3 - 4)",
    ]
    assert AgentProject.load(folder, warm_vms=0, max_vms=1).scaling.max_vms == 1


def test_a_broken_key_does_not_hide_other_rules_nor_invent_them(agent_folder) -> None:
    folder = agent_folder("[scaling]\nmin_vms = 3\nmax_vms = 2\nwarm_vms = \"x\"\n[image]\nmemory_mib = 3000\n[serve]\nmax_concurrency = 9\n")
    assert sorted(load_error(folder)) == sorted([
        "warm_vms: 'x' is not a whole number",
        "min_vms: 3 is above max_vms (2)",
        "memory_mib: 3000 is not a MicroVM size class (512, 1024, 2048, 4096, 8192 MiB)",
    ])


def test_a_linked_folder_keeps_the_name_it_is_called_by(agent_folder, tmp_path) -> None:
    target = agent_folder(None, name="agent-v2")
    link = tmp_path / "bot"
    link.symlink_to(target, target_is_directory=True)
    assert AgentProject.load(link).name == "bot"


@pytest.mark.parametrize(("folder_name", "hint"), [("agénte", "agente"), ("ａｇｅｎｔ", "agent"), ("mi agente", "mi-agente")])
def test_a_bad_folder_name_suggests_a_good_one(agent_folder, folder_name, hint) -> None:
    (message,) = load_error(agent_folder(None, name=folder_name))
    assert f"for example {hint!r}" in message


def test_model_copy_with_a_mapping_changes_only_those_keys() -> None:
    project = AgentProject.load(EXAMPLE)
    bigger = project.model_copy(update={"scaling": {"max_vms": 5}})
    assert (bigger.scaling.max_vms, bigger.scaling.idle, bigger.scaling.warm_vms) == (5, 600, 1)
    assert bigger.sources["max_vms"] == "explicit" and bigger.sources["idle"] == "project"
    assert problems_of(lambda: project.model_copy(update={"scaling": {"min_vms": 9}})) == [
        "min_vms: 9 is above max_vms (3)",
        "warm_vms: 1 is above the limit of 0 (max_vms - min_vms = 3 - 9)",
    ]

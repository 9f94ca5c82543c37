"""The project model is the product's: every folder `rayito agent init` makes loads unchanged, the
flags of `rayito agent deploy` apply as the product applies them, and what the product refuses
is refused with its reason, in one line naming the key or flag and the value."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rayito_constructs import AgentProject, ProjectError
from rayito_constructs.model.fleet_file import FLEET_FILE

from .conftest import EXAMPLE
from .projects import scaffold, write_project

RUNTIMES = ["strands", "strands-harness", "langgraph", "deepagents", "opencode", "hermes", "custom"]
PROVIDERS = ["bedrock", "anthropic", "openai"]
SCAFFOLDS = [(r, "python", p) for r in RUNTIMES for p in PROVIDERS] + [("strands", "typescript", p) for p in PROVIDERS]


def tree(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of a folder with its mtime and content: what "never writes into it" compares."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("runtime", "language", "provider"), SCAFFOLDS)
def test_every_scaffold_loads_unchanged(tmp_path, runtime, language, provider) -> None:
    from rayito._agent._deploy_plan import project_for

    folder = scaffold(tmp_path / f"{runtime}-{language}-{provider}", runtime, language, provider)
    before = tree(folder)
    project = AgentProject.load(folder)
    theirs, _ = project_for(folder, None, None, None)
    # what the recipe embeds is the product's project after deploy's preflight (default excludes)
    ours = project.to_product_dict()
    assert {k: v for k, v in ours.items() if k != "source"} == {k: v for k, v in theirs.to_dict().items() if k != "source"}
    assert set(theirs.to_dict()["source"]["exclude"]) <= set(ours["source"]["exclude"])
    assert project.name == folder.name and project.runtime == runtime
    assert project.scaling.min_vms == 1 and project.scaling.max_vms == 1 and project.serve.idle == 300
    assert tree(folder) == before  # nothing written into the user's folder
    assert not (folder / ".rayito").exists()


def test_the_example_is_a_product_project() -> None:
    from rayito import AgentProject as ProductProject

    product = ProductProject.load(EXAMPLE)  # the product's own loader reads it
    project = AgentProject.load(EXAMPLE)
    assert project.name == product.name == "mi-agente"
    assert project.runtime == "custom" and project.serve.port == 8088
    assert (project.scaling.min_vms, project.scaling.max_vms, project.scaling.warm_vms) == (1, 3, 1)
    assert project.serve.idle == 600 and project.serve.max_concurrency == 2 and project.serve.queue_max == 4
    assert project.allow_out == ("bedrock-runtime.us-east-1.amazonaws.com", "api.example.com")
    assert [b.target for b in project.egress.budgets] == ["https://api.example.com",
                                                          "https://api.example.com/v1/search?region"]
    assert project.scaling_source == "project" and project.sources["idle_seconds"] == "project"


def test_flags_apply_as_the_product_applies_them(tmp_path) -> None:
    folder = write_project(tmp_path / "f", name="f", tables={"scaling": {"max_vms": 3}, "env": {"A": "1"},
                                                               "network": {"allow_out": ["a.example.com"]}})
    project = AgentProject.load(folder, min_vms=2, max_vms=5, warm=2, sessions="shared", scale_in_after=1200,
                                max_sessions=4, queue=8, queue_timeout=12.5, idle=900, timeout=1800,
                                memory=4096, env=["B=2"], allow_out=["b.example.com"],
                                secret_env=["DB_URL=app/db#url"])
    assert (project.scaling.min_vms, project.scaling.max_vms, project.scaling.warm_vms) == (2, 5, 2)
    assert project.scaling.scale_in_after_seconds == 1200 and project.scaling_source == "explicit"
    assert project.serve.max_concurrency == 4 and project.serve.queue_max == 8 and project.serve.queue_timeout_seconds == 12.5
    assert project.serve.idle == 900 and project.serve.timeout_seconds == 1800 and project.image.memory_mib == 4096
    assert project.env == {"A": "1", "B": "2"}  # --env adds to [env]
    assert project.allow_out == ("b.example.com",)  # --allow-out replaces [network] allow_out
    assert project.secret_env == {"DB_URL": "app/db"}
    # as in the product, the scaling flags reach only the recipe's scaling, not the project's table
    assert project.to_product_dict()["scaling"] == {"max_vms": 3}
    assert project.sources["min_vms"] == "explicit" and project.sources["env"] == "explicit"


def test_max_sessions_is_checked_against_the_files_memory_as_deploy_does(tmp_path) -> None:
    folder = write_project(tmp_path / "m", name="m")  # 2048 MiB: at most 7 sessions
    with pytest.raises(ProjectError) as info:
        AgentProject.from_flags(folder, flags={"memory": 4096, "max_sessions": 15})
    (line,) = str(info.value).splitlines()
    assert line.startswith("--max-sessions: 15: ") and "7" in line


@pytest.mark.parametrize(("tables", "key", "words"), [
    ({"serve": {"port": 8080}}, "serve", ["8080", "rayd"]),
    ({"serve": {"port": 9000}}, "serve", ["9000"]),
    ({"serve": {"idle_seconds": 30}}, "serve.idle_seconds", ["30", "60"]),
    ({"scaling": {"max_vms": 65}}, "scaling", ["64"]),
    ({"scaling": {"min_vms": 3, "max_vms": 2}}, "scaling", ["min_vms"]),
    ({"scaling": {"min_vms": 1, "max_vms": 3, "warm_vms": 3}}, "scaling", ["warm"]),
    ({"scaling": {"scale_in_after_seconds": 59}}, "scaling", ["60"]),
    ({"serve": {"queue_max": 257}}, "serve", ["256"]),
    ({"serve": {"queue_timeout_seconds": 901}}, "serve", ["900"]),
    ({"image": {"memory_mib": 1024}}, "image.memory_mib", ["2048"]),
    ({"env": {"API_TOKEN": "x"}}, "env", ["API_TOKEN"]),
    ({"env": {"REGION_LABEL": "ASIA-PACIFIC"}}, "env.REGION_LABEL: ", ["secret_value"]),  # never the value
    ({"egresss": {"allow": ["x"]}}, "egresss", ["clave desconocida"]),
    ({"x_cdk": {"stack": "a"}}, "x_cdk", ["clave desconocida"]),
    ({"secret_env": {f"S{i}": f"app/s{i}" for i in range(21)}}, "secret_env", ["20"]),
    ({"secret_env": {"AWS_KEY": "app/x"}}, "secret_env", ["AWS_"]),
])
def test_what_the_product_refuses_is_refused_in_one_line(tmp_path, tables, key, words) -> None:
    folder = write_project(tmp_path / "bad", name="bad", tables=tables)
    with pytest.raises(ProjectError) as info:
        AgentProject.load(folder)
    lines = str(info.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(key), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in lines[0]


def test_a_refusal_shows_the_value_of_the_file(tmp_path) -> None:
    folder = write_project(tmp_path / "v", name="v", tables={"serve": {"idle_seconds": 30}})
    with pytest.raises(ProjectError, match=r"^serve\.idle_seconds = 30: "):
        AgentProject.load(folder)


@pytest.mark.parametrize(("name", "rejected"), [
    ("DB_PASS", True), ("GITHUB_PAT", True), ("X_AUTH", True), ("TOKEN", True), ("github_token", True),
    ("SECRET", True), ("AUTH_X_HEADER", True), ("AUTH_MODE", False), ("AUTHOR_NAME", False),
    ("TOKEN_URL", False), ("PASSPHRASE", False), ("GPG_PASSPHRASE", False), ("PATH_PREFIX", False),
])
def test_the_env_flag_rule_is_the_products(tmp_path, name, rejected) -> None:
    from rayito.cli._agent_deploy import env_flag_looks_secret

    assert env_flag_looks_secret(name) is rejected  # the product's own rule
    folder = write_project(tmp_path / "e", name="e")
    if rejected:
        with pytest.raises(ProjectError, match=rf"^--env: {name}: "):
            AgentProject.from_flags(folder, flags={"env": [f"{name}=v"]})
    else:
        assert AgentProject.from_flags(folder, flags={"env": [f"{name}=v"]}).env[name] == "v"


@pytest.mark.parametrize("value", ["sk-proj-abcdef", "AKIAABCDEFGHIJKLMNOP", "ghp_short", "Bearer x", "xoxb-123",
                                   "ABSKabc", "AIzaSyXX"])
def test_credential_shaped_values_are_refused_as_the_product_refuses_them(tmp_path, value) -> None:
    folder = write_project(tmp_path / "c", name="c")
    with pytest.raises(ProjectError) as info:
        AgentProject.from_flags(folder, flags={"env": [f"CONFIG={value}"]})
    assert str(info.value).startswith("--env: CONFIG: ") and value not in str(info.value)


@pytest.mark.parametrize(("flags", "start"), [
    ({"min_vms": "2"}, "--min-vms: '2' is not a whole number"),
    ({"max_vms": True}, "--max-vms: true is not a whole number"),
    ({"queue_timeout": "x"}, "--queue-timeout: 'x' is not a number of seconds"),
    ({"save_recipe": "no"}, "--no-save-recipe: 'no' is not true or false"),
    ({"env": 3}, "--env: 3 is not a list of strings"),
    ({"max_vm": 3}, "max_vm: unknown flag of rayito agent deploy; did you mean 'max_vms'?"),
    ({"max_vms": 65}, "--max-vms: 65: "),
    ({"idle": 0}, "--idle: 0: "),
    ({"port": 8080}, "--port: 8080: "),
    ({"sessions": "solo"}, "--sessions: 'solo': "),
    ({"env": ["NOPE"]}, "--env: NOPE: "),
    ({"secret_env": ["X=sk-abc"]}, "--secret-env: X: "),
    ({"memory": 3072}, "--memory: 3072 is not a MicroVM size class"),
    ({"memory": 1024}, "--memory: 1024: "),
    # the product's reason names the limit, not its value: the value follows it
    ({"min_vms": 3, "max_vms": 2}, "--min-vms: 3: ScalingOptions.min_vms no puede superar a max_vms (max_vms is 2)"),
    ({"min_vms": 2}, "--min-vms: 2: ScalingOptions.min_vms no puede superar a max_vms (max_vms is 1)"),
    ({"warm": 5}, "--warm: 5: ScalingOptions.warm_vms no puede superar a max_vms - min_vms "
                  "(max_vms - min_vms is 1 - 1 = 0)"),
    ({"warm": 5, "max_vms": 4, "min_vms": 2}, "--min-vms: 2, --max-vms: 4, --warm: 5: ScalingOptions.warm_vms no puede "
                                              "superar a max_vms - min_vms (max_vms - min_vms is 4 - 2 = 2)"),
])
def test_flag_errors_name_the_flag_and_the_value(tmp_path, flags, start) -> None:
    """As plan and app.py get them (``from_flags``: the product's flag names, each then renamed
    to what was typed), and as ``AgentProject.load``'s keywords name them (``max_vms: ...``)."""
    from rayito_constructs.model.product import FLAG_NAMES

    folder = write_project(tmp_path / "fl", name="fl")
    with pytest.raises(ProjectError) as info:
        AgentProject.from_flags(folder, flags=flags)
    lines = str(info.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), lines
    for key in flags:
        start = start.replace(f"{FLAG_NAMES.get(key, key)}: ", f"{key}: ")
    with pytest.raises(ProjectError) as info:
        AgentProject.load(folder, **flags)
    lines = str(info.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith(start) and "--" not in lines[0].split(": ")[0], lines


def test_load_takes_env_and_secret_env_as_mappings(tmp_path) -> None:
    """``env={"A": "1"}`` as ``-c env='{"A": "1"}'`` takes it (and NAME=VALUE strings)."""
    folder = write_project(tmp_path / "m", name="m")
    project = AgentProject.load(folder, env={"A": "1", "URL": "https://a,b"}, secret_env={"DB": "prod/db"})
    assert project.env["A"] == "1" and project.env["URL"] == "https://a,b"
    assert project.secret_env["DB"] == "prod/db"
    assert AgentProject.load(folder, env=["A=1"]).env["A"] == "1"
    assert AgentProject.from_flags(folder, flags={"secret_env": {"DB": "prod/db"}}).secret_env["DB"] == "prod/db"
    for env, line in (({"A=B": "1"}, "env: 'A=B': a name is a string without '='"),
                      ({"A": None}, "env: A: None is not a string")):
        with pytest.raises(ProjectError) as info:
            AgentProject.load(folder, env=env)
        assert str(info.value) == line


def test_folders_the_product_cannot_read(tmp_path) -> None:
    with pytest.raises(ProjectError, match=r"^folder: '.*nowhere' is not a folder$"):
        AgentProject.load(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ProjectError) as info:  # no rayito-agent.toml, and detection finds no agent
        AgentProject.load(empty)
    (line,) = str(info.value).splitlines()
    assert line.startswith("source: ") and "(not_detected)" in line
    (empty / "rayito-agent.toml").write_text("schema = [\n")
    with pytest.raises(ProjectError) as info:
        AgentProject.load(empty)
    assert len(str(info.value).splitlines()) == 1


def test_our_own_file_holds_what_the_product_does_not(tmp_path) -> None:
    folder = write_project(tmp_path / "own", name="own", tables={
        "egress": {"default_rate": "10/second", "default_burst": 7,
                   "budgets": [{"target": "https://api.example.com", "rate": "2/s", "burst": 3}]},
        "stack": {"metrics": True, "keep_image_versions": 9}})
    assert "egress" not in (folder / "rayito-agent.toml").read_text()
    project = AgentProject.load(folder)
    assert project.egress.default_burst == 7 and project.egress.budgets[0].burst == 3
    assert project.fleet.stack.metrics is True and project.fleet.stack.keep_image_versions == 9
    (folder / FLEET_FILE).write_text('[egress]\ndefault_brust = 3\n')
    with pytest.raises(ProjectError, match=r"^rayito-constructs.toml: egress.default_brust: unknown key in \[egress\]; "
                                           r"did you mean 'default_burst'\?"):
        AgentProject.load(folder)
    (folder / FLEET_FILE).write_text('[stak]\nmetrics = true\n')
    with pytest.raises(ProjectError, match=r"^rayito-constructs.toml: stak: unknown option; did you mean 'stack'\?"):
        AgentProject.load(folder)
    for text, line in (
        ("metrics = true", "metrics: unknown option; did you mean [stack] metrics?"),  # a table's key at the top
        ("default_burst = 3", "default_burst: unknown option; did you mean [egress] default_burst?"),
        ("budgets = []", "budgets: unknown option; did you mean [[egress.budgets]]?"),
        ('rate = "1/s"', "rate: unknown option; did you mean [[egress.budgets]] rate?"),
        ("[stack]\ndefault_burst = 3", "stack.default_burst: unknown key in [stack]; default_burst is a key of [egress]"),
        ("[egress]\nmetrics = true", "egress.metrics: unknown key in [egress]; metrics is a key of [stack]"),
        ("nada = 1", "nada: unknown option"),
    ):
        (folder / FLEET_FILE).write_text(f"{text}\n")
        with pytest.raises(ProjectError) as info:
            AgentProject.load(folder)
        assert str(info.value) == f"rayito-constructs.toml: {line}"


def test_our_refusals_beyond_the_products(tmp_path) -> None:
    folder = write_project(tmp_path / "r", name="r", tables={"image": {"memory_mib": 3072}})
    with pytest.raises(ProjectError, match=r"^image.memory_mib: 3072 is not a MicroVM size class the fleet's image "
                                           r"can have \(2048, 4096, 8192 MiB\)$"):
        AgentProject.load(folder)
    folder = write_project(tmp_path / "t", name="t", tables={"image": {"template": "no spaces please"}})
    with pytest.raises(ProjectError, match=r"^image.template: 'no spaces please' must be"):
        AgentProject.load(folder)


def test_detection_decides_a_folder_without_a_project_file(tmp_path) -> None:
    folder = tmp_path / "detected"
    folder.mkdir()
    (folder / "requirements.txt").write_text("strands-agents\n")
    (folder / "agent.py").write_text('from strands import Agent\n'
                                     'agent = Agent(model="us.anthropic.claude-haiku-4-5-20251001-v1:0")\n')
    project = AgentProject.load(folder, region="us-east-1")
    assert project.runtime == "strands" and [w.code for w in project.warnings] == ["no_project_file"]
    assert not (folder / "rayito-agent.toml").exists()


def test_with_flags_keeps_the_earlier_ones(tmp_path) -> None:
    project = AgentProject.load(write_project(tmp_path / "w", name="w"), max_vms=4)
    again = project.with_flags(warm=2)
    assert (again.scaling.max_vms, again.scaling.warm_vms) == (4, 2)


def test_loading_does_not_read_the_environment_for_flags(tmp_path, monkeypatch) -> None:
    """RAYITO_ACCESS_TOKEN and AWS settings of the machine change nothing of what is planned."""
    folder = write_project(tmp_path / "env", name="env")
    plain = AgentProject.load(folder).to_product_dict()
    monkeypatch.setenv("RAYITO_ACCESS_TOKEN", "x" * 43)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert AgentProject.load(folder).to_product_dict() == plain
    assert os.listdir(folder) == os.listdir(folder)  # nothing new

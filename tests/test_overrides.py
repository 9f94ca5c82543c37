"""Flags typed as text: `plan` flags and `cdk synth -c key=value`, read by one table, with the
names of `rayito agent deploy`'s flags (`-c max_sessions`, `-c warm`, `-c memory`...)."""

from __future__ import annotations

import pytest

from rayito_constructs.model.overrides import read_context, read_overrides


def test_env_commas_inside_values() -> None:
    assert read_overrides({"env": "URL=https://a,b"})["env"] == ("URL=https://a,b",)
    assert read_overrides({"env": "A=1,B=2"})["env"] == ("A=1", "B=2")
    assert read_overrides({"env": "Q=a=b,c,D=x=y"})["env"] == ("Q=a=b,c", "D=x=y")
    assert read_overrides({"env": '{"URL": "https://a,b", "C": "x,Y=z"}'})["env"] == ("URL=https://a,b", "C=x,Y=z")
    # One --env flag is one variable: no splitting at all.
    assert read_overrides({"env": ["A=1,B=2", "C=3"]})["env"] == ("A=1,B=2", "C=3")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "env: '' is not NAME=VALUE"),
        ("novalue", "env: 'novalue' is not NAME=VALUE"),
        ("=x", "env: '=x' is not NAME=VALUE"),
        ('{"A": ', "env: '{\"A\": ' is not valid JSON (Expecting value at character 6)"),
        ('{"A"}', "env: '{\"A\"}' is not valid JSON (Expecting ':' delimiter at character 4)"),
    ],
)
def test_env_that_is_not_pairs(value, message) -> None:
    with pytest.raises(ValueError) as info:
        read_overrides({"env": value})
    assert str(info.value) == message


def test_context_keys_are_checked_like_flags() -> None:
    context = {
        "max_vm": "5",
        "@aws-cdk/core:newStyleStackSynthesis": True,
        "aws:cdk:enable-path-metadata": True,
        "availability-zones:account=123456789012:region=us-east-1": ["us-east-1a"],
        "projct": "x",
        "env.": "x",
        "warm_vms": "1",  # the library's old name; the flag is --warm
    }
    _, _, problems = read_context(context)
    assert [p.message for p in problems] == [
        "-c max_vm: unknown context key; did you mean 'max_vms'?",
        "-c projct: unknown context key; did you mean 'project'?",
        "-c env.: unknown context key; did you mean 'env'?",
        "-c warm_vms: unknown context key; did you mean 'warm'?",
    ]


def test_context_values_in_every_form() -> None:
    overrides, app, problems = read_context({
        "min_vms": "2", "max_vms": 4, "idle": "600", "env.URL": "https://a,b", "env.LEVEL": "debug",
        "secret_env.DB_URL": "app/db#url", "allow_out": "a.example.com, b.example.com", "queue_timeout": "12.5",
        "metadata_index": True, "keep_recipe": "false", "project": "examples/mi-agente", "save_recipe": "no",
        "max_sessions": "4", "warm": "1", "memory": "8192", "renew_gateway_keys": "true",
    })
    assert problems == []
    assert overrides == {
        "min_vms": 2, "max_vms": 4, "idle": 600, "env": ("URL=https://a,b", "LEVEL=debug"),
        "secret_env": ("DB_URL=app/db#url",), "allow_out": ("a.example.com", "b.example.com"), "save_recipe": False,
        "queue_timeout": 12.5, "max_sessions": 4, "warm": 1, "memory": 8192, "renew_gateway_keys": True,
    }
    assert app == {"metadata_index": True, "keep_recipe": False, "project": "examples/mi-agente"}


def test_context_mistakes_name_the_key() -> None:
    overrides, _, problems = read_context({
        "metadata_index": "maybe", "image_arn": "", "env": "A=1", "env.B": "2", "min_vms": "two", "max_vms": "3",
    })
    assert [p.message for p in problems] == [
        "-c env: give the variables either as -c env=... or as -c env.NAME=..., not both",
        "-c metadata_index: 'maybe' is not true or false",
        "-c image_arn: '' is not a MicroVM image ARN",
    ]
    # A value no reader can parse is left for the project, which says what it is not.
    assert overrides["min_vms"] == "two" and overrides["max_vms"] == 3


def test_whole_numbers_are_ascii() -> None:
    assert read_overrides({"max_vms": " 3 "})["max_vms"] == 3
    assert read_overrides({"max_vms": "３"})["max_vms"] == "３"  # left for the flag check to refuse
    assert read_overrides({"max_vms": "٣"})["max_vms"] == "٣"


def test_a_table_prefix_in_context_points_to_the_flag() -> None:
    _, _, problems = read_context({"scaling.max_vms": "3"})
    assert [p.message for p in problems] == ["-c scaling.max_vms: unknown context key; did you mean 'max_vms'?"]


@pytest.mark.parametrize(("context", "egress", "problems"), [
    ({"egress.default_burst": "7", "egress.default_rate": "10/second"},
     {"default_burst": 7, "default_rate": "10/second"}, []),
    ({"egress.budgets": '[{"target": "https://a.example.com", "rate": "1/s"}]'},
     {"budgets": [{"target": "https://a.example.com", "rate": "1/s"}]}, []),
    ({"egress.budgets": [{"target": "https://a.example.com", "rate": 1}]},  # cdk.json's own types
     {"budgets": [{"target": "https://a.example.com", "rate": 1}]}, []),
    ({"egress.budgets": "{}"}, None, ["-c egress.budgets: '{}' is not a JSON list of [[egress.budgets]] tables"]),
    ({"egress.default_burts": "3"}, None, ["-c egress.default_burts: unknown context key; did you mean "
                                           "'egress.default_burst'?"]),
    ({"egress.x": "1"}, None,
     ["-c egress.x: unknown context key; [egress] takes egress.default_rate, egress.default_burst, egress.budgets"]),
])
def test_egress_keys_of_our_file_are_context(context, egress, problems) -> None:
    """``-c egress.<key>``: the [egress] keys of rayito-constructs.toml (checked as the file's are,
    when the app merges them over it: tests/test_app.py); an unknown one names the known ones."""
    _, app, found = read_context(context)
    assert app.get("egress") == egress
    assert [p.message[:len(w)] for p, w in zip(found, problems)] == problems and len(found) == len(problems)

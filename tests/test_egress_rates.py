"""Rates, bursts and costs: refused the same way at every entry (options, Envelope,
put_envelope, acquire), with the value named."""

from __future__ import annotations

import math

import pytest

from rayito_constructs.egress import Envelope, RateError, parse_rate
from rayito_constructs.model.errors import ProjectError
from rayito_constructs.model.project import AgentProject
from rayito_constructs.model.rates import MAX_BURST, check_burst, check_cost, recipe_rate


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("60/minute", 1.0), ("10/second", 10.0), ("10/s", 10.0), (" 30 / MIN ", 0.5), ("1000/hour", 1000 / 3600),
     ("2/day", 2 / 86400), ("1.5", 1.5), ("5", 5.0), (".5/s", 0.5), ("1e2/minute", 100 / 60), (3, 3.0), (0.25, 0.25)],
)
def test_rates(text, per_second) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("nan/second", "is not a rate"),
        ("inf/s", "is not a rate"),
        ("1e400/s", "is not finite"),
        (float("nan"), "is not finite"),
        (float("inf"), "is not finite"),
        (-float("inf"), "is not finite"),
        (10**400, "is not finite"),
        ("-5/second", "is not above 0"),
        (-1, "is not above 0"),
        ("0/minute", "is not above 0"),
        (0, "is not above 0"),
        ("1e-9/s", "below the minimum"),
        ("2e6/s", "above the limit"),
        ("sixty", "is not a rate such as 60/minute"),
        ("60/fortnight", "is not a rate"),
        ("60/", "is not a rate"),
        ("1_000/s", "is not a rate"),
        ("", "is not a rate"),
        (True, "is not a rate"),
        (None, "is not a rate"),
        ([1], "is not a rate"),
    ],
)
def test_bad_rates_name_the_value(value, reason) -> None:
    with pytest.raises(RateError) as info:
        parse_rate(value)
    assert reason in str(info.value) and str(info.value).startswith(repr(value))
    assert info.value.reason in str(info.value)


@pytest.mark.parametrize(("value", "reason"), [(0, "below the minimum of 1"), (-3, "below the minimum"),
                                               (2.5, "not a whole number"), (True, "not a whole number"),
                                               ("5", "not a whole number"), (math.nan, "not a whole number"),
                                               (MAX_BURST + 1, "above the limit")])
def test_bad_bursts(value, reason) -> None:
    with pytest.raises(RateError, match=reason):
        check_burst(value)
    with pytest.raises(RateError, match=reason):
        Envelope("https://api.example.com", 1, value)


def test_bursts_and_costs() -> None:
    assert check_burst(2.0) == 2 and isinstance(check_burst(2.0), int)
    assert check_cost(3, 3) == 3 and check_cost(1.0, 3) == 1
    for cost, reason in [(0, "below the minimum"), (-1, "below the minimum"), (4, "above the envelope's burst of 3"),
                         (1.5, "whole number"), (False, "whole number"), (math.inf, "whole number")]:
        with pytest.raises(RateError, match=reason):
            check_cost(cost, 3)


def test_envelope_is_validated() -> None:
    assert Envelope("https://x.org", "60/minute", 5).rate_per_second == 1.0
    for rate in (0, -1, math.nan, math.inf, "nan/second", "1e400/s"):
        with pytest.raises(RateError):
            Envelope("https://x.org", rate, 5)


def test_recipe_keeps_small_rates() -> None:
    assert recipe_rate(parse_rate("1/day")) == pytest.approx(1 / 86400, rel=1e-10)
    assert recipe_rate(parse_rate("60/minute")) == 1.0


def load_problems(agent_folder, toml: str) -> list[str]:
    with pytest.raises(ProjectError) as info:
        AgentProject.load(agent_folder(toml, name="bad"))
    return [p.message for p in info.value.problems]


@pytest.mark.parametrize(
    ("rate", "expected"),
    [('"nan/second"', "'nan/second' is not a rate"), ('"1e400/s"', "'1e400/s' is not finite"),
     ('"-5/s"', "'-5/s' is not above 0"), ("0", "0 is not above 0"), ("inf", "inf is not finite"),
     ("nan", "nan is not finite"), ('"0/minute"', "'0/minute' is not above 0")],
)
def test_the_options_refuse_them_too(agent_folder, rate, expected) -> None:
    toml = f'[[egress.budgets]]\ntarget = "https://x.org"\nrate = {rate}\nburst = 2\n[egress]\ndefault_rate = {rate}\n'
    problems = load_problems(agent_folder, toml)
    assert any(p.startswith("rayito-constructs.toml: egress.budgets[0].rate: ") and expected in p for p in problems), problems
    assert any("default_rate" in p and expected in p for p in problems), problems


def test_the_options_refuse_fractional_bursts(agent_folder) -> None:
    problems = load_problems(agent_folder, '[[egress.budgets]]\ntarget = "https://x.org"\nrate = 1\nburst = 2.5\n')
    assert any("burst" in p and "2.5" in p for p in problems), problems

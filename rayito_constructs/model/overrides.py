"""The flags of ``rayito agent deploy`` typed as text (``plan`` flags, ``cdk -c key=value``),
turned into the values of ``AgentProject.load``.

One table decides how each flag is read, so ``plan --min-vms 2`` and ``cdk synth -c min_vms=2``
mean the same thing and fail with the same message, naming what the user typed (``--min-vms`` or
``-c min_vms``). Context keys are the flags' names with ``_`` (``-c max_sessions=4``,
``-c warm=2``, ``-c memory=4096``, ``-c save_recipe=false`` for ``--no-save-recipe``).

``env`` and ``secret_env`` take ``NAME=VALUE`` pairs (``NAME=<secret id>`` for ``secret_env``): one
per ``--env`` flag; in context either
``-c env=A=1,B=2`` (a comma splits only where ``NAME=`` follows, so ``-c env=URL=https://a,b``
is one variable), ``-c 'env={"URL": "https://a,b=c"}'`` (JSON, for any value) or one key per
variable, ``-c env.URL=https://a,b``.

``rayito-constructs.toml``'s ``[stack]`` keys are context keys under their names, its ``[egress]``
keys ``-c egress.default_rate``, ``-c egress.default_burst`` and ``-c egress.budgets`` (a JSON
list of tables, replacing the file's): :data:`EGRESS_CONTEXT`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable, Mapping

from .cloudwatch_limits import MAX_ALARM_ACTIONS, RETENTION_DAYS, SNS_TOPIC_ARN
from .errors import Problem, ProjectError, did_you_mean, show
from .product import FLAG_NAMES

_PAIR_SPLIT = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_]*\s*=)")


def _whole(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.lstrip("-").isdigit():
            return int(text)
    return value


def _json(value: str, wanted: type, what: str) -> Any:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{show(value)} is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(parsed, wanted):
        raise ValueError(f"{show(value)} is not {what}")
    return parsed


def _pairs(value: Any) -> Any:
    """``["A=1", "B=2"]``, ``"A=1,B=2"`` or ``'{"A": "1"}'`` → ``{"A": "1", "B": "2"}``.

    In the one-string form a comma separates two pairs only when ``NAME=`` follows it, so
    ``URL=https://a,b`` is one pair; a mapping stays as is.
    """
    if isinstance(value, Mapping) or (isinstance(value, str) and value.lstrip().startswith("{")):
        table = dict(value) if isinstance(value, Mapping) else _json(value, dict, 'a JSON object of NAME to value '
                                                                                  '({"NAME": "value"})')
        for name, given in table.items():
            if "=" in str(name) or not str(name).strip():
                raise ValueError(f"{show(name)}: a name is a string without '='")
            if given is None or isinstance(given, (dict, list)):
                raise ValueError(f"{name}: {show(given)} is not a value")
        return table
    items: Iterable[Any] = _PAIR_SPLIT.split(value) if isinstance(value, str) else list(value)
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, val = str(item).partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{show(item)} is not NAME=VALUE")
        pairs[name.strip()] = val
    return pairs


def _names(value: Any) -> Any:
    if not isinstance(value, (str, list, tuple)):
        raise ValueError(f"{show(value)} is not a comma-separated list of hosts")
    if isinstance(value, str):
        if value.lstrip().startswith("["):
            return tuple(_json(value, list, 'a JSON list of hosts (["a.example.com"])'))
        return tuple(v.strip() for v in value.split(","))
    return tuple(value)


def _flag(value: Any) -> Any:
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in {"true", "yes", "1", "on"}:
            return True
        if lowered in {"false", "no", "0", "off"}:
            return False
    return value


def _number(value: Any) -> Any:
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value else number
    return value


def _pair_list(value: Any) -> Any:
    """``--env`` pairs as the product's flag takes them: ``("A=1", "B=2")``."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if not isinstance(value, (str, list, tuple, Mapping)):
        raise ValueError(f"{show(value)} is not NAME=VALUE pairs")
    return tuple(f"{k}={v}" for k, v in _pairs(value).items())


def _strings(value: Any) -> Any:
    if not isinstance(value, (str, list, tuple)):
        raise ValueError(f"{show(value)} is not a list")
    if isinstance(value, str) and value.lstrip().startswith("["):
        return tuple(_json(value, list, 'a JSON list (["a", "b"])'))
    return (value,) if isinstance(value, str) else tuple(value)


#: How each flag of ``rayito agent deploy`` is read from text (a ``plan`` flag, ``-c`` context).
READERS: dict[str, Callable[[Any], Any]] = {
    **{name: _whole for name in ("min_vms", "max_vms", "warm", "scale_in_after", "max_sessions", "queue", "idle",
                                 "port", "memory")},
    **{name: _number for name in ("queue_timeout", "timeout")},
    **{name: _flag for name in ("save_recipe", "renew_gateway_keys")},
    **{name: str for name in ("sessions", "framework", "language", "entry", "protocol", "model_id", "model_provider",
                              "model_base_url", "graph", "region")},
    "env": _pair_list,
    "secret_env": _pair_list,
    "secret_env_from": _strings,
    "allow_out": _names,
}

#: Context keys of ``app.py`` that are not project options, with what they take.
APP_CONTEXT: dict[str, str] = {
    "project": "the agent folder",
    "image_arn": "a MicroVM image ARN",
    "metadata_index": "true or false",
    "keep_recipe": "true or false",
    "reconciler": "true or false (default: on when the fleet saves a recipe)",
    "scope_microvm_actions_to_image": "true or false",
    "metrics": "true or false",
    "dashboard": "true or false",
    "saved_queries": "true or false",
    "alarm_actions": "SNS topic ARNs, comma-separated",
    "log_retention": "a CloudWatch Logs retention in days (90), 0 for never expire",
    "retain_vms_on_delete": "true or false",
    "keep_image_versions": "a whole number of image versions from 1 to 49 (default 5), or none",
    "base_artifact": "the path of the product's rayito-image.zip (as rayito agent deploy --base-artifact)",
    "base_artifact_sha256": "the sha256 of base_artifact, 64 hexadecimal digits",
    "base_image": "the base image published in the account to compose on at deploy, the project's [image] base "
                  "(rayito-base-caps)",
    "base_image_version": "the managed base image's major version, such as 1",
    "build_image": "true or false (false: as rayito agent deploy --no-build, the image is not built)",
}


#: The keys of ``rayito-constructs.toml``'s ``[egress]`` that ``app.py`` takes as ``-c egress.<key>``,
#: with what they take (checked as the file's keys are: :meth:`FleetFile.with_egress`).
EGRESS_CONTEXT: dict[str, str] = {
    "default_rate": "the envelope of a target no budget declares, such as 120/minute",
    "default_burst": "its burst, a whole number of requests from 1 to 10000",
    "budgets": 'a JSON list of [[egress.budgets]] tables ([{"target": "https://api.example.com", '
               '"rate": "60/minute", "burst": 5}]); it replaces the file\'s',
}


def _egress_value(key: str, value: Any) -> Any:
    """A ``-c egress.<key>`` value as the file would hold it (text from the CLI, or cdk.json's own
    types). Raises ValueError for budgets that are not JSON."""
    if key == "default_burst":
        return _whole(value)
    if key == "budgets" and isinstance(value, str):
        return _json(value, list, f"{EGRESS_CONTEXT['budgets']}")
    return value


def read_overrides(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Convert text overrides; unknown keys pass through for ``AgentProject.load`` to reject."""
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for key, value in raw.items():
        reader = READERS.get(key)
        if reader is None:
            values[key] = value
            continue
        try:
            values[key] = reader(value)
        except ValueError as exc:
            problems.append(Problem(key, f"{key}: {exc}"))
    if problems:
        raise ProjectError(problems)
    return values


def is_user_context_key(key: str) -> bool:
    """False for the CDK's own context: feature flags (``@aws-cdk/...``), the CLI's ``aws:cdk:...``
    settings and cached lookups (``availability-zones:account=...``)."""
    return not key.startswith("@") and ":" not in key


def read_context(context: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[Problem]]:
    """Split and read the context of ``cdk synth``: ``(project overrides, app.py options, problems)``.

    Every key a user can set is checked like a key of ``rayito-agent.toml``: an unknown one is a
    problem with the nearest known key (``-c max_vm=5``: did you mean ``max_vms``?). Booleans
    must be true or false. Each problem names ``-c key``; the overrides that could be read are
    returned all the same, so the project's own problems can be reported with them at once.
    """
    problems: list[Problem] = []
    raw, app, per_name = _split_context(context, problems)
    for table, variables in per_name.items():
        if table in raw:
            problems.append(Problem(table, f"-c {table}: give the variables either as -c {table}=... or as -c {table}.NAME=..., not both"))
        else:
            raw[table] = variables
    _read_app_context(app, problems)
    overrides: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            overrides.update(read_overrides({key: value}))
        except ProjectError as exc:  # a value the flag's reader cannot read: named as typed, -c key
            problems.extend(Problem(p.key, f"-c {p.message}" if p.message.startswith(f"{key}: ") else p.message,
                                    p.related) for p in exc.problems)
    return overrides, app, problems


def _split_context(
    context: Mapping[str, Any], problems: list[Problem],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """The user's keys of ``context`` as ``(project flags, app.py options, env.NAME and
    secret_env.NAME variables by table)``; an unknown key is a problem with the nearest known one."""
    raw: dict[str, Any] = {}
    app: dict[str, Any] = {}
    per_name: dict[str, dict[str, Any]] = {}
    egress: dict[str, Any] = {}
    for key, value in context.items():
        if not is_user_context_key(key):
            continue
        table, dot, variable = key.partition(".")
        if dot and table in ("env", "secret_env") and variable:
            per_name.setdefault(table, {})[variable] = value if isinstance(value, str) else json.dumps(value)
        elif table == "egress" and variable in EGRESS_CONTEXT:
            try:
                egress[variable] = _egress_value(variable, value)
            except ValueError as exc:
                problems.append(Problem(key, f"-c {key}: {exc}"))
        elif key in READERS:
            raw[key] = value
        elif key in APP_CONTEXT:
            app[key] = value
        else:
            problems.append(Problem(key, f"-c {key}: unknown context key{_unknown_hint(key)}"))
    if egress:
        app["egress"] = egress
    return raw, app, per_name


def _unknown_hint(key: str) -> str:
    """The nearest known key of an unknown ``-c key`` (an ``[egress]`` one among ``egress.*``)."""
    known = [*READERS, *APP_CONTEXT, *(f"egress.{k}" for k in EGRESS_CONTEXT)]
    table, dot, variable = key.partition(".")
    egress_hint = (did_you_mean(variable, EGRESS_CONTEXT).replace("'", "'egress.", 1)
                   or f"; [egress] takes {', '.join(f'egress.{k}' for k in EGRESS_CONTEXT)}")
    return (
        (egress_hint if table == "egress" and dot else "")
        or did_you_mean(key, known)
        or (did_you_mean(variable, known) if dot and variable else "")  # -c scaling.max_vms=3
        or ("; env.NAME and secret_env.NAME take one variable" if table in ("env", "secret_env") else "")
    )


#: The switches of ``app.py`` read from context: each true or false.
_APP_FLAGS = ("metadata_index", "keep_recipe", "reconciler", "scope_microvm_actions_to_image", "metrics", "dashboard",
              "saved_queries", "retain_vms_on_delete", "build_image")


def _read_app_context(app: dict[str, Any], problems: list[Problem]) -> None:
    """Read the options of ``app.py`` in place (a switch becomes a bool, a retention a number of
    days...); each one that cannot be read is a problem naming ``-c key``."""
    for key in _APP_FLAGS:
        if key in app:
            flag = _flag(app[key])
            if not isinstance(flag, bool):
                problems.append(Problem(key, f"-c {key}: {show(app[key])} is not true or false"))
            app[key] = flag
    if "base_artifact_sha256" in app and not re.fullmatch(r"[0-9a-fA-F]{64}", str(app["base_artifact_sha256"])):
        problems.append(Problem("base_artifact_sha256", f"-c base_artifact_sha256: {show(app['base_artifact_sha256'])} "
                                                        f"is not {APP_CONTEXT['base_artifact_sha256']}"))
    # base_artifact_sha256 without base_artifact: app.py, once the folder's [stack] is known (it may give the zip).
    if "base_image_version" in app:
        app["base_image_version"] = str(app["base_image_version"])
    if "base_image" in app and "base_artifact" in app:
        problems.append(Problem("base_image", "-c base_image: give -c base_artifact or -c base_image, not both (a release "
                                              "zip composed at synth, or the base published in the account, composed at deploy)"))
    for key in ("project", "image_arn", "base_artifact", "base_image"):
        if key in app and (not isinstance(app[key], str) or not app[key].strip()):
            problems.append(Problem(key, f"-c {key}: {show(app[key])} is not {APP_CONTEXT[key]}"))
    if "alarm_actions" in app:
        app["alarm_actions"] = _topics(app["alarm_actions"], problems)
    if "log_retention" in app:
        app["log_retention"] = _retention(app["log_retention"], problems)
    if "keep_image_versions" in app:
        app["keep_image_versions"] = _versions_kept(app["keep_image_versions"], problems)


def _topics(value: Any, problems: list[Problem]) -> tuple[str, ...]:
    """``-c alarm_actions=arn1,arn2`` (or a JSON list): SNS topic ARNs, each checked."""
    arns = _names(value) if isinstance(value, (str, list, tuple)) else (value,)
    arns = tuple(dict.fromkeys(a for a in arns if a != ""))  # the same topic twice is one action
    for arn in arns:
        if not isinstance(arn, str) or not SNS_TOPIC_ARN.match(arn):
            problems.append(Problem("alarm_actions", f"-c alarm_actions: {show(arn)} is not an SNS topic ARN "
                                                     "(arn:aws:sns:<region>:<account>:<topic>)"))
    if not arns:
        problems.append(Problem("alarm_actions", "-c alarm_actions: give at least one SNS topic ARN"))
    if len(arns) > MAX_ALARM_ACTIONS:
        problems.append(Problem("alarm_actions", f"-c alarm_actions: {len(arns)} topics; a CloudWatch alarm takes "
                                                 f"at most {MAX_ALARM_ACTIONS} actions"))
    return arns


def _versions_kept(value: Any, problems: list[Problem]) -> Any:
    """``-c keep_image_versions=5`` (``none``: never prune). The limits are ``ImagePruner``'s: an
    image holds at most 50 versions, and the next build needs room for one."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    kept = _whole(value)
    if isinstance(kept, bool) or not isinstance(kept, int) or not 1 <= kept <= 49:
        problems.append(Problem("keep_image_versions", f"-c keep_image_versions: {show(value)} is not "
                                                       f"{APP_CONTEXT['keep_image_versions']}"))
        return 5
    return kept


def _retention(value: Any, problems: list[Problem]) -> Any:
    """``-c log_retention=90``: days CloudWatch Logs offers (0: never expire)."""
    days = _whole(value)
    allowed = sorted(v for v in RETENTION_DAYS.values() if v is not None)
    if isinstance(days, bool) or not isinstance(days, int) or (days != 0 and days not in allowed):
        problems.append(Problem("log_retention", f"-c log_retention: {show(value)} is not a retention CloudWatch Logs "
                                                 f"offers: {', '.join(map(str, allowed))} days, or 0 for never expire"))
        return None
    return days


def name_what_was_typed(problems: Iterable[Problem], given: set[str], *, context: bool,
                        keyword: bool = False) -> list[Problem]:
    """Problems about flags start with the flag (``--max-vms: ...``); for ``cdk synth`` context
    they start with what was typed there (``-c max_vms: ...``), for ``AgentProject.load``'s
    keywords with the keyword (``max_vms: ...``). The others are unchanged."""
    named: list[Problem] = []
    for problem in problems:
        flag = FLAG_NAMES.get(problem.key)
        if not (context or keyword) or flag is None or problem.key not in given \
                or not problem.message.startswith(f"{flag}: "):
            named.append(problem)
            continue
        message = problem.message
        for key in dict.fromkeys((problem.key, *problem.related)):  # a rule two flags broke names both
            if key in FLAG_NAMES and key in given:
                message = message.replace(f"{FLAG_NAMES[key]}: ", f"-c {key}: " if context else f"{key}: ", 1)
        named.append(Problem(problem.key, message, problem.related))
    return named

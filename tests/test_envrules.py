"""The --env rule, case by case as the product page lists them."""

import pytest

from rayito_constructs.envrules import looks_secret, secret_reason

SECRET = [
    # *_TOKEN, *_KEY, *_SECRET, *_PASSWORD...
    "GITHUB_TOKEN", "OPENAI_API_KEY", "CLIENT_SECRET", "DB_PASSWORD", "GPG_PASSPHRASE", "X_APIKEY",
    # a PASS, PASSWD, PAT, CREDENTIAL or CREDENTIALS segment
    "DB_PASS", "PASS_FILE", "MYSQL_PASSWD", "GITHUB_PAT", "PAT_VALUE", "AWS_CREDENTIAL",
    "GOOGLE_CREDENTIALS", "CREDENTIALS_JSON",
    # AUTH or BEARER last, or next to TOKEN, KEY or HEADER
    "X_AUTH", "API_BEARER", "AUTH_HEADER", "BEARER_HEADER", "AUTH_TOKEN_URL", "AUTH_KEY_ID",
    "HEADER_AUTH_NAME",
    # one segment that is the clause's word itself
    "PASS", "AUTH", "BEARER", "_TOKEN",
]
PLAIN = [
    "AUTH_MODE", "AUTHOR_NAME", "LOG_LEVEL", "GREETING", "PATH", "PASSAGE_COUNT", "KEYBOARD_LAYOUT",
    "TOKENIZER_NAME", "SECRETARY_EMAIL", "PATH_PREFIX", "AUTH_URL", "BEARER_MODE", "KEY_PREFIX",
    "PATTERN", "COMPASS", "OAUTH_SCOPE", "HEADER_NAME",
    # the page's patterns as written: *_TOKEN needs the underscore, the words are upper case
    "TOKEN", "KEY", "SECRET", "PASSWORD", "MYTOKEN", "api_key", "github_token", "db_pass", "x_auth",
]


@pytest.mark.parametrize("name", SECRET)
def test_secret_names_are_rejected(name: str) -> None:
    assert looks_secret(name), name
    assert secret_reason(name)


@pytest.mark.parametrize("name", PLAIN)
def test_plain_names_are_accepted(name: str) -> None:
    assert not looks_secret(name), secret_reason(name)


def test_reason_names_the_clause() -> None:
    assert secret_reason("GITHUB_TOKEN") == "it ends in _TOKEN"
    assert secret_reason("DB_PASS") == "it has a PASS segment"
    assert secret_reason("X_AUTH") == "AUTH is its last segment"
    assert secret_reason("AUTH_HEADER_NAME") == "AUTH stands next to HEADER"
    assert secret_reason("_TOKEN") == "it ends in _TOKEN"
    # Nothing says "it ends in _TOKEN" of a name that does not.
    for name in ("TOKEN", "XTOKEN", "TOKEN_X", "token"):
        assert secret_reason(name) is None, name


# ------------------------------------------------------------------ values shaped like credentials

import io  # noqa: E402

from rayito_constructs import AgentProject, ProjectError  # noqa: E402
from rayito_constructs.cli import main as cli  # noqa: E402
from rayito_constructs.envrules import credential_shape  # noqa: E402

# Built from parts so that no string of this file is a credential-shaped literal.
CREDENTIALS = {
    "postgres://admin:" + "pw@db.internal:5432/app": "a URL with a user and password",
    "redis://:" + "s3cret@cache:6379/0": "a URL with a user and password",
    "https://oauth2:" + "tok@gitlab.example.com/group/repo.git": "a URL with a user and password",
    "https://" + "x" * 24 + "@github.com/org/repo.git": "a URL with a token as its user",
    "ghp_" + "A1b2" * 9: "a GitHub token",
    "--token gho_" + "z" * 36: "a GitHub token",
    "github_pat_" + "11ABCDEFG0" * 3: "a GitHub token",
    "glpat-" + "x" * 20: "a GitLab token",
    "AKIA" + "IOSFODNN7EXAMPLE": "an AWS access key id",
    "ASIA" + "Q" * 16: "an AWS access key id",
    "xoxb-" + "1234567890-abcdefghij": "a Slack token",
    "https://hooks.slack.com/services/" + "T000/B000/xxxx": "a Slack webhook URL",
    "sk-" + "proj-" + "a1" * 20: "an API secret key (sk-...)",
    "sk-" + "ant-api03-" + "b" * 30: "an API secret key (sk-...)",
    "sk_" + "live_" + "c" * 24: "a Stripe key",
    "AIza" + "d" * 35: "a Google API key",
    "hf_" + "e" * 34: "a Hugging Face token",
    "npm_" + "f" * 36: "an npm token",
    "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0" + ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U": "a JSON Web Token",
    "-----BEGIN " + "OPENSSH PRIVATE KEY-----\nb3Blbn...": "a private key block",
    "-----BEGIN " + "PRIVATE KEY-----": "a private key block",
    "-----BEGIN " + "PGP PRIVATE KEY BLOCK-----": "a private key block",
    "Bearer " + "abcdefghijklmnop0123": "an Authorization header value",
}
PLAIN_VALUES = [
    "", "info", "Hola", "https://api.example.com/v1", "postgres://db.internal:5432/app", "sk-learn", "scikit-learn",
    "ssh://git@github.com/org/repo.git", "mailto:someone@example.com", "https://user@example.com/",
    "arn:aws:iam::123456789012:role/agent", "us-east-1", "550e8400-e29b-41d4-a716-446655440000",
    "d41d8cd98f00b204e9800998ecf8427e", "eyJhbGciOiJIUzI1NiJ9", "Bearer", "bearer token", "xoxo", "AKIA",
    "ghp_short", "hooks.slack.com", "BEGIN PRIVATE KEY", "a:b@c", "http://localhost:8080/path@v2",
]


@pytest.mark.parametrize("value, shape", list(CREDENTIALS.items()))
def test_credential_shapes(value: str, shape: str) -> None:
    assert credential_shape(value) == shape


@pytest.mark.parametrize("value", PLAIN_VALUES)
def test_plain_values(value: str) -> None:
    assert credential_shape(value) is None


def test_a_project_follows_the_products_value_rule_not_these_shapes(agent_folder) -> None:
    """These shapes guard an AgentImage's environment only: a project's [env] and --env follow the
    product's rule (its credential prefixes), which takes a URL with a password and refuses sk-."""
    url = "postgres://admin:" + "hunter2@db/app"
    assert AgentProject.load(agent_folder(env={"DATABASE_URL": url}, name="url")).env["DATABASE_URL"] == url
    with pytest.raises(ProjectError) as info:
        AgentProject.load(agent_folder(env={"KEYISH": "sk-" + "learn"}, name="sk"))
    assert "hunter2" not in str(info.value) and len(info.value.problems) == 1
    out = io.StringIO()
    assert cli(["plan", str(agent_folder(name="planned")), "--env", "OTHER=" + "ghp_" + "A1b2" * 9], out=out) == 2

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

"""The offline IAM evaluator (``rayito_constructs.model.policy_eval``) on its own: one row per rule it
claims, each with the decision IAM's documentation gives. The first 22 rows are the cases every
candidate library was run against (``shared/research/product-iam.md`` 5.1); the rest cover what
the proof and verify rely on besides."""

from __future__ import annotations

from typing import Any

import pytest

from rayito_constructs.model.policy_eval import PolicyError, action_matches, evaluate, glob_match

A = "arn:aws:lambda:us-east-1:123456789012"
ROLE = "arn:aws:iam::123456789012:role/rayito-m0-build-us-east-1"
SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret"


def pol(*statements: dict[str, Any], version: str = "2012-10-17") -> dict[str, Any]:
    return {"Version": version, "Statement": list(statements)}


def allow(action: Any, resource: Any = "*", condition: Any = None, **extra: Any) -> dict[str, Any]:
    statement = {"Effect": "Allow", "Action": action, "Resource": resource, **extra}
    if condition:
        statement["Condition"] = condition
    return statement


def deny(action: Any, resource: Any = "*", condition: Any = None) -> dict[str, Any]:
    return {**allow(action, resource, condition), "Effect": "Deny"}


PASSED = {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}

#: (case, documents, action, resource, context, allowed)
CASES = [
    ("action wildcard lambda:Get*", [pol(allow("lambda:Get*", f"{A}:microvm-image:*"))],
     "lambda:GetMicrovmImage", f"{A}:microvm-image:foo", {}, True),
    ("action case-insensitive", [pol(allow("lambda:GetMicrovmImage"))], "Lambda:getmicrovmimage", f"{A}:x", {}, True),
    ("resource glob foo* matches foobar", [pol(allow("lambda:RunMicrovm", f"{A}:microvm-image:foo*"))],
     "lambda:RunMicrovm", f"{A}:microvm-image:foobar", {}, True),
    ("resource glob foo* rejects bar", [pol(allow("lambda:RunMicrovm", f"{A}:microvm-image:foo*"))],
     "lambda:RunMicrovm", f"{A}:microvm-image:bar", {}, False),
    ("resource is case-sensitive", [pol(allow("lambda:RunMicrovm", f"{A}:microvm-image:foo"))],
     "lambda:RunMicrovm", f"{A}:microvm-image:FOO", {}, False),
    ("resource ? wildcard", [pol(allow("lambda:RunMicrovm", f"{A}:microvm-image:fo?"))],
     "lambda:RunMicrovm", f"{A}:microvm-image:foo", {}, True),
    ("a '+' in a resource is literal", [pol(allow("secretsmanager:GetSecretValue", f"{SECRET}:a+b*"))],
     "secretsmanager:GetSecretValue", f"{SECRET}:aab-AbCdEf", {}, False),
    ("StringEquals iam:PassedToService", [pol(allow("iam:PassRole", ROLE, PASSED))],
     "iam:PassRole", ROLE, {"iam:PassedToService": "lambda.amazonaws.com"}, True),
    ("StringEquals, another service", [pol(allow("iam:PassRole", ROLE, PASSED))],
     "iam:PassRole", ROLE, {"iam:PassedToService": "ec2.amazonaws.com"}, False),
    ("StringEquals, key absent", [pol(allow("iam:PassRole", ROLE, PASSED))], "iam:PassRole", ROLE, {}, False),
    ("explicit Deny overrides Allow", [pol(allow("lambda:*"), deny("lambda:UpdateMicrovmImage", f"{A}:microvm-image:rayito-base*"))],
     "lambda:UpdateMicrovmImage", f"{A}:microvm-image:rayito-base-caps", {}, False),
    ("a Deny elsewhere does not block", [pol(allow("lambda:*"), deny("lambda:UpdateMicrovmImage", f"{A}:microvm-image:rayito-base*"))],
     "lambda:UpdateMicrovmImage", f"{A}:microvm-image:proj", {}, True),
    ("NotResource in a Deny guard", [pol(allow("lambda:RunMicrovm"),
                                         {"Effect": "Deny", "Action": "lambda:RunMicrovm", "NotResource": [f"{A}:microvm-image:ok"]})],
     "lambda:RunMicrovm", f"{A}:microvm-image:other", {}, False),
    ("NotAction allow", [pol({"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"})], "lambda:ListMicrovms", "*", {}, True),
    ("kms:ViaService, another service", [pol(allow("kms:Decrypt", "*", {"StringEquals": {"kms:ViaService": "secretsmanager.us-east-1.amazonaws.com"}}))],
     "kms:Decrypt", "arn:aws:kms:us-east-1:123456789012:key/k", {"kms:ViaService": "ssm.us-east-1.amazonaws.com"}, False),
    ("StringLike s3:prefix", [pol(allow("s3:ListBucket", "arn:aws:s3:::b", {"StringLike": {"s3:prefix": "rayito-transfer/*"}}))],
     "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "rayito-transfer/x"}, True),
    ("Bool aws:SecureTransport false, a Deny", [pol(allow("s3:*"), deny("s3:*", "*", {"Bool": {"aws:SecureTransport": "false"}}))],
     "s3:GetObject", "arn:aws:s3:::b/k", {"aws:SecureTransport": "false"}, False),
    ("Null true, key absent", [pol(allow("s3:GetObject", "*", {"Null": {"s3:x-amz-server-side-encryption": "true"}}))],
     "s3:GetObject", "arn:aws:s3:::b/k", {}, True),
    ("ArnLike aws:SourceArn", [pol(allow("sts:AssumeRole", "*", {"ArnLike": {"aws:SourceArn": f"{A}:microvm-image:*"}}))],
     "sts:AssumeRole", "*", {"aws:SourceArn": f"{A}:microvm-image:x"}, True),
    ("ForAnyValue:StringEquals", [pol(allow("lambda:TagResource", "*", {"ForAnyValue:StringEquals": {"aws:TagKeys": ["a", "b"]}}))],
     "lambda:TagResource", "*", {"aws:TagKeys": ["z", "b"]}, True),
    ("ForAllValues:StringEquals", [pol(allow("lambda:TagResource", "*", {"ForAllValues:StringEquals": {"aws:TagKeys": ["a", "b"]}}))],
     "lambda:TagResource", "*", {"aws:TagKeys": ["z", "b"]}, False),
    ("StringEqualsIfExists, key absent", [pol(allow("iam:PassRole", "*", {"StringEqualsIfExists": {"iam:PassedToService": "lambda.amazonaws.com"}}))],
     "iam:PassRole", ROLE, {}, True),
    # ---- beyond the candidates' table
    ("no statement: implicit deny", [pol(allow("ssm:GetParameter"))], "ssm:PutParameter", "*", {}, False),
    ("a Deny in another document wins", [pol(allow("ssm:*")), pol(deny("ssm:PutParameter"))], "ssm:PutParameter", "*", {}, False),
    ("a Deny with NotAction", [pol(allow("*"), {"Effect": "Deny", "NotAction": ["lambda:*"], "Resource": "*"})],
     "ssm:PutParameter", "*", {}, False),
    ("a Deny with NotAction leaves the rest", [pol(allow("*"), {"Effect": "Deny", "NotAction": ["lambda:*"], "Resource": "*"})],
     "lambda:RunMicrovm", "*", {}, True),
    ("a statement without Resource matches nothing", [pol({"Effect": "Allow", "Action": "*"})], "ssm:GetParameter", "arn:x", {}, False),
    ("'*' crosses ':' and '/'", [pol(allow("ssm:GetParameter", "arn:aws:ssm:*"))],
     "ssm:GetParameter", "arn:aws:ssm:us-east-1:1:parameter/rayito/agents/x/recipe", {}, True),
    ("the secret suffix: -?????? is exactly six", [pol(allow("secretsmanager:GetSecretValue", f"{SECRET}:rayito/key-??????"))],
     "secretsmanager:GetSecretValue", f"{SECRET}:rayito/key-extra-AbCdEf", {}, False),
    ("the secret suffix: -?????? matches the real ARN", [pol(allow("secretsmanager:GetSecretValue", f"{SECRET}:rayito/key-??????"))],
     "secretsmanager:GetSecretValue", f"{SECRET}:rayito/key-AbCdEf", {}, True),
    ("a policy variable in a resource", [pol(allow("s3:GetObject", "arn:aws:s3:::b/${aws:username}/*"))],
     "s3:GetObject", "arn:aws:s3:::b/ana/x", {"aws:username": "ana"}, True),
    ("a policy variable, another user", [pol(allow("s3:GetObject", "arn:aws:s3:::b/${aws:username}/*"))],
     "s3:GetObject", "arn:aws:s3:::b/bea/x", {"aws:username": "ana"}, False),
    ("a policy variable whose key is absent", [pol(allow("s3:GetObject", "arn:aws:s3:::b/${aws:username}/*"))],
     "s3:GetObject", "arn:aws:s3:::b/ana/x", {}, False),
    ("a variable's value is literal, never a wildcard", [pol(allow("s3:GetObject", "arn:aws:s3:::b/${aws:username}"))],
     "s3:GetObject", "arn:aws:s3:::b/anything", {"aws:username": "*"}, False),
    ("${*} is a literal star", [pol(allow("s3:GetObject", "arn:aws:s3:::b/${*}"))], "s3:GetObject", "arn:aws:s3:::b/x", {}, False),
    ("version 2008-10-17 has no variables", [pol(allow("s3:GetObject", "arn:aws:s3:::b/${aws:username}"), version="2008-10-17")],
     "s3:GetObject", "arn:aws:s3:::b/${aws:username}", {"aws:username": "ana"}, True),
    ("ArnEquals takes wildcards per part", [pol(allow("sts:AssumeRole", "*", {"ArnEquals": {"aws:SourceArn": f"{A}:microvm-image:*"}}))],
     "sts:AssumeRole", "*", {"aws:SourceArn": f"{A}:microvm-image:x"}, True),
    ("ArnLike never lets '*' cross a part", [pol(allow("sts:AssumeRole", "*", {"ArnLike": {"aws:SourceArn": "arn:aws:lambda:*:microvm-image:x"}}))],
     "sts:AssumeRole", "*", {"aws:SourceArn": f"{A}:microvm-image:x"}, False),
    ("ArnLike on a name prefix is not the image and its versions", [pol(allow("sts:AssumeRole", "*", {"ArnLike": {"aws:SourceArn": [f"{A}:microvm-image:x", f"{A}:microvm-image:x:*"]}}))],
     "sts:AssumeRole", "*", {"aws:SourceArn": f"{A}:microvm-image:x-dev"}, False),
    ("StringNotEquals, key absent matches", [pol(allow("s3:GetObject", "*", {"StringNotEquals": {"s3:x": "a"}}))], "s3:GetObject", "*", {}, True),
    ("StringNotEquals with two values is neither", [pol(allow("s3:GetObject", "*", {"StringNotEquals": {"s3:x": ["a", "b"]}}))],
     "s3:GetObject", "*", {"s3:x": "b"}, False),
    ("conditions AND across keys", [pol(allow("kms:Decrypt", "*", {"StringEquals": {"kms:ViaService": "ssm.us-east-1.amazonaws.com", "aws:PrincipalAccount": "1"}}))],
     "kms:Decrypt", "*", {"kms:ViaService": "ssm.us-east-1.amazonaws.com"}, False),
    ("condition keys are case-insensitive", [pol(allow("iam:PassRole", ROLE, PASSED))],
     "iam:PassRole", ROLE, {"IAM:passedtoservice": "lambda.amazonaws.com"}, True),
    ("condition values are case-sensitive", [pol(allow("iam:PassRole", ROLE, PASSED))],
     "iam:PassRole", ROLE, {"iam:PassedToService": "Lambda.amazonaws.com"}, False),
    ("StringEqualsIgnoreCase", [pol(allow("iam:PassRole", ROLE, {"StringEqualsIgnoreCase": {"iam:PassedToService": "LAMBDA.amazonaws.com"}}))],
     "iam:PassRole", ROLE, {"iam:PassedToService": "lambda.amazonaws.com"}, True),
    ("ForAllValues on an empty key holds", [pol(allow("lambda:TagResource", "*", {"ForAllValues:StringEquals": {"aws:TagKeys": ["a"]}}))],
     "lambda:TagResource", "*", {"aws:TagKeys": []}, True),
    ("ForAnyValue on an absent key fails", [pol(allow("lambda:TagResource", "*", {"ForAnyValue:StringEquals": {"aws:TagKeys": ["a"]}}))],
     "lambda:TagResource", "*", {}, False),
    ("ForAllValues:StringEquals dynamodb:LeadingKeys", [pol(allow("dynamodb:PutItem", "*", {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["mi-agente"]}}))],
     "dynamodb:PutItem", "*", {"dynamodb:LeadingKeys": ["mi-agente"]}, True),
    ("Null false needs the key", [pol(allow("s3:GetObject", "*", {"Null": {"s3:x": "false"}}))], "s3:GetObject", "*", {}, False),
    ("NumericLessThanEquals", [pol(allow("s3:GetObject", "*", {"NumericLessThanEquals": {"s3:max-keys": "10"}}))],
     "s3:GetObject", "*", {"s3:max-keys": "10"}, True),
    ("DateLessThan", [pol(allow("s3:GetObject", "*", {"DateLessThan": {"aws:CurrentTime": "2030-01-01T00:00:00Z"}}))],
     "s3:GetObject", "*", {"aws:CurrentTime": "2026-12-01T10:00:00Z"}, True),
    ("DateGreaterThan", [pol(allow("s3:GetObject", "*", {"DateGreaterThan": {"aws:CurrentTime": "2030-01-01T00:00:00Z"}}))],
     "s3:GetObject", "*", {"aws:CurrentTime": "2026-12-01T10:00:00Z"}, False),
    ("IpAddress", [pol(allow("s3:GetObject", "*", {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}))],
     "s3:GetObject", "*", {"aws:SourceIp": "10.1.2.3"}, True),
    ("NotIpAddress", [pol(allow("s3:GetObject", "*", {"NotIpAddress": {"aws:SourceIp": "10.0.0.0/8"}}))],
     "s3:GetObject", "*", {"aws:SourceIp": "10.1.2.3"}, False),
    ("a policy variable in a condition value", [pol(allow("s3:ListBucket", "*", {"StringLike": {"s3:prefix": "home/${aws:username}/*"}}))],
     "s3:ListBucket", "*", {"s3:prefix": "home/ana/x", "aws:username": "ana"}, True),
    ("an Action list matches any of them", [pol(allow(["ssm:GetParameter", "ssm:DeleteParameter"], "*"))],
     "ssm:DeleteParameter", "*", {}, True),
]


@pytest.mark.parametrize("case, documents, action, resource, context, allowed", CASES, ids=[c[0] for c in CASES])
def test_decision(case: str, documents: Any, action: str, resource: str, context: Any, allowed: bool) -> None:
    assert evaluate(documents, action, resource, context).allowed is allowed


def test_the_decision_names_the_statements() -> None:
    documents = [pol({**allow("ssm:*"), "Sid": "Everything"}, {**deny("ssm:PutParameter"), "Sid": "NeverWrite"})]
    decision = evaluate(documents, "ssm:PutParameter", "arn:aws:ssm:us-east-1:1:parameter/x")
    assert (decision.allowed, decision.allow_sids, decision.deny_sids, decision.label) == (
        False, ("Everything",), ("NeverWrite",), "explicitDeny")
    unnamed = evaluate([pol(allow("ssm:GetParameter"))], "ssm:GetParameter", "x")
    assert (unnamed.label, unnamed.allow_sids) == ("allowed", ("#0",))
    assert evaluate([pol(allow("ssm:GetParameter"))], "ssm:PutParameter", "x").label == "implicitDeny"


def test_a_boundary_limits_what_the_identity_allows() -> None:
    identity = [pol(allow("lambda:*"))]
    boundary = [pol(allow("lambda:RunMicrovm", f"{A}:microvm-image:x"))]
    assert evaluate(identity, "lambda:RunMicrovm", f"{A}:microvm-image:x", boundaries=boundary).allowed
    outside = evaluate(identity, "lambda:RunMicrovm", f"{A}:microvm-image:y", boundaries=boundary)
    assert not outside.allowed and outside.outside_boundary
    assert not evaluate([pol(allow("ssm:GetParameter"))], "lambda:RunMicrovm", f"{A}:microvm-image:x",
                        boundaries=boundary).allowed  # the boundary grants nothing by itself


@pytest.mark.parametrize("statement, message", [
    (allow("s3:GetObject", "*", {"StringMatches": {"s3:x": "a"}}), "unsupported condition operator"),
    (allow("s3:GetObject", "*", {"ForSomeValues:StringEquals": {"s3:x": "a"}}), "unknown set operator"),
    ({**allow("s3:GetObject"), "Principal": {"AWS": "*"}}, "principal"),
    ({**allow("s3:GetObject"), "Effect": "allow"}, "is not Allow or Deny"),
])
def test_what_it_cannot_decide_raises(statement: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        evaluate([pol(statement)], "s3:GetObject", "arn:aws:s3:::b/k", {"s3:x": "a"})


def test_matching_helpers() -> None:
    assert action_matches("ssm:Put*", "ssm:PutParameter") and action_matches("SSM:p?tparameter", "ssm:PutParameter")
    assert not action_matches("ssm:PutParameterX", "ssm:PutParameter")
    assert glob_match("a*", "a:b/c") and not glob_match("a", "A")

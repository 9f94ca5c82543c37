"""The peer ``cdk-github-microvm-runners`` 0.1.19 (jsii): one runner set with one runner class, as
its README's app (webhook, queue, launcher, janitor, table, the class's image).

    CDK_OUTDIR=out <peers-python> benchmarks/peer_apps/github_microvm_runners_app.py
"""

import aws_cdk as cdk
from aws_cdk.aws_secretsmanager import Secret
from cdk_github_microvm_runners import GithubAppId, GithubAppKey, GithubAuth, GithubMicrovmRunners, MicrovmSize, RunnerScope

app = cdk.App()
stack = cdk.Stack(app, "PeerGithubMicrovmRunners", env=cdk.Environment(account="123456789012", region="us-east-1"))
runners = GithubMicrovmRunners(
    stack, "Runners",
    github=GithubAuth.app(
        app_id=GithubAppId.from_secret(Secret.from_secret_name_v2(stack, "AppId", "microvm-runner/dev/app-id")),
        private_key=GithubAppKey.from_secret(Secret.from_secret_name_v2(stack, "AppKey", "microvm-runner/dev/app-key")),
        webhook_secret=Secret.from_secret_name_v2(stack, "WebhookSecret", "microvm-runner/dev/webhook-secret"),
    ),
    scope=RunnerScope.org("my-org"),
)
runners.add_runner_class("microvm", size=MicrovmSize.GB4)
cdk.CfnOutput(stack, "WebhookUrl", value=runners.webhook_url)
app.synth()

"""The ``verify`` subcommand's arguments, apart from its checks.

``rayito-constructs plan`` and ``assembly`` build the whole parser on every start; this module
imports nothing but argparse, so those commands never load boto3 or verify's AWS clients (a
``make synth`` environment has neither AWS credentials nor, by design, anything ``verify`` needs).
"""

from __future__ import annotations

import argparse
from typing import Any

EXIT_INVALID = 2


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add the ``verify`` subcommand to ``rayito-constructs``' subparsers."""
    parser = commands.add_parser(
        "verify", help="check a deployed fleet against the real account (read-only unless --launch)",
        description="Check a deployed fleet against its AWS account: account and region, quotas, image, IAM "
                    "(simulated), recipe, reconciler, egress budgets; --launch starts one VM. Read-only otherwise.")
    parser.add_argument("target", metavar="fleet-name-or-stack", help="the fleet's name or its stack's name")
    parser.add_argument("--region", help="the fleet's region (default: AWS_REGION or the profile's)")
    parser.add_argument("--launch", action="store_true",
                        help="start one VM from the fleet's image, wait for it to answer, terminate it (costs money)")
    parser.add_argument("--launch-role", metavar="ROLE_ARN",
                        help="launch as this role, limited to SandboxLauncherPolicy (default: your credentials)")
    parser.add_argument("--launch-timeout", metavar="SECONDS", default="180",
                        help="how long to wait for the VM to answer (seconds, default 180)")
    parser.add_argument("--project", metavar="FOLDER", help="the agent folder, to compare the recipe with")
    parser.add_argument("--fleet", metavar="NAME", help="the fleet, when the stack holds several")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser

"""rayito_constructs: AWS CDK v2 constructs for fleets of AI-agent Lambda MicroVMs.

The project model (the product's, ``rayito``, after the deploy flags), the recipe and the ``plan``
command are plain Python. The constructs import aws-cdk-lib (which starts a Node.js process through jsii), so they are loaded on
first use: ``from rayito_constructs import AgentFleet`` works as usual.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# jsii prints an 11-line banner on stderr when the first `import aws_cdk` starts Node.js 20 (past
# its end of life). Imported before aws_cdk, this library keeps that banner, and only Node 20's,
# out of a user's `cdk synth`; set the variable yourself (to "" to see the banner) and this does
# nothing. Trade-offs in docs/getting-started.md ("The Node.js 20 banner").
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from .model.errors import FleetWarning, Problem, ProjectError
from .model.fleet_file import FleetFile, StackOptions
from .model.options import EgressBudgetOptions, EgressOptions
from .model.product import DeployFlags
from .model.project import AgentProject
from .model.recipe import RecipePlan, plan_recipe

__version__ = "0.1.0"

# Public constructs, by the module that defines them (imported lazily: see the module docstring).
_CONSTRUCTS = {
    "AgentFleet": "fleet",
    "ImportedAgentFleet": "fleet",
    "FleetStack": "stack",
    "CallerPolicy": "policies",
    "ImagePublisherPolicy": "policies",
    "SandboxLauncherPolicy": "policies",
    "RecipeParameter": "recipe_parameter",
    "MetadataIndex": "metadata_index",
    "MicrovmExecutionRole": "execution_role",
    "FleetReconciler": "reconciler",
    "ControlPlaneBudget": "control_plane_budget",
    "FleetLedger": "fleet_ledger",
    "AgentImage": "agent_image",
    "ImageComposer": "image_composer",
    "PublishedBaseImage": "image_composer",
    "EgressBudget": "egress_budget",
    "FleetDashboard": "dashboard",
    "FleetQueries": "queries",
    "Operations": "monitoring",
    "FleetTeardown": "fleet_teardown",
    "ImagePruner": "image_pruner",
}

__all__ = [
    "AgentProject",
    "DeployFlags",
    "EgressBudgetOptions",
    "EgressOptions",
    "FleetFile",
    "FleetWarning",
    "Problem",
    "ProjectError",
    "RecipePlan",
    "StackOptions",
    "plan_recipe",
    *_CONSTRUCTS,
]


def __getattr__(name: str) -> Any:
    module = _CONSTRUCTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rayito_constructs' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)

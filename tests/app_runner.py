"""app.py run in this process as ``cdk synth -c key=value...`` runs it, and the stacks it wrote:
for the tests of app.py's context (tests/test_app.py, tests/test_monitoring.py)."""

from __future__ import annotations

import importlib.util
import json

from .conftest import ROOT


def load_app():
    spec = importlib.util.spec_from_file_location("rayito_app", ROOT / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synth(monkeypatch, tmp_path, capsys, **context):
    """Run app.py's main() in this process as `cdk synth -c key=value...` would."""
    import aws_cdk as cdk

    from .cdk_helpers import stand_in_rayd

    context.setdefault("base_artifact", stand_in_rayd())  # fleets build the product's agent image
    context = {k: v for k, v in context.items() if v is not None}
    outdir = tmp_path / "cdk.out"
    code = load_app().main(cdk.App(outdir=str(outdir), context=context, analytics_reporting=False))
    err = capsys.readouterr().err
    return code, err, outdir


def stacks(outdir):
    manifest = json.loads((outdir / "manifest.json").read_text())
    return {
        artifact["properties"].get("stackName", key): json.loads((outdir / artifact["properties"]["templateFile"]).read_text())
        for key, artifact in manifest["artifacts"].items()
        if artifact["type"] == "aws:cloudformation:stack"
    }

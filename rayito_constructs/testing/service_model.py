"""The botocore model of ``lambda-microvms`` the emulator speaks: the installed botocore's, else the
copy the reconciler Lambda bundles. Below both the wire protocol (``_wire``) and the errors
(``exceptions``), which read their routes, members and status codes from it."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import botocore.session
from botocore.model import ServiceModel

SERVICE = "lambda-microvms"


@lru_cache(maxsize=1)
def service_model() -> ServiceModel:
    """The botocore model of Lambda MicroVMs: the installed botocore's (1.43.35 or newer), else the
    copy the reconciler Lambda bundles (``lambdas/reconciler/data``)."""
    from botocore.exceptions import UnknownServiceError

    try:
        return botocore.session.get_session().get_service_model(SERVICE)
    except UnknownServiceError:
        return bundled_service_model()


def bundled_service_model() -> ServiceModel:
    """The model file shipped with the reconciler Lambda (``lambdas/reconciler/data``)."""
    here = Path(__file__).resolve()
    candidates = [here.parents[2] / "lambdas" / "reconciler" / "data"]
    try:
        import rayito_constructs._lambdas.reconciler as bundled

        candidates.insert(0, Path(bundled.__file__).resolve().parent / "data")
    except ImportError:
        pass
    for data in candidates:
        found = sorted(data.glob(f"{SERVICE}/*/service-2.json"))
        if found:
            return ServiceModel(json.loads(found[-1].read_text()), service_name=SERVICE)
    raise RuntimeError(f"no {SERVICE} model: install botocore>=1.43.35")

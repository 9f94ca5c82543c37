"""The chokepoint: HTTP client adapters that take a token before every request leaves.

    session = requests.Session()
    session.mount("https://", BudgetAdapter(client, step=lambda: current_step()))
    httpx.Client(transport=BudgetTransport(client))

A request without a token never leaves: the adapter raises :class:`EgressDeferred` carrying the
:class:`Deferral` (target, ``retry_after_seconds``, reason), so the caller (the agent's scheduler)
decides what to do, instead of a silent failure. A response 429 or 503 puts the target in backoff
for every holder of the envelope, for its ``Retry-After`` (or ``default_backoff_seconds``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from .client import BudgetClient, Deferral

StepSource = Union[None, str, Callable[[], Optional[str]]]
BACKOFF_STATUSES = (429, 503)


class EgressDeferred(Exception):
    """The request was not sent: its target has no budget now."""

    def __init__(self, deferral: Deferral) -> None:
        super().__init__(f"{deferral.target}: {deferral.reason}, retry after {deferral.retry_after_seconds:.3f} s")
        self.deferral = deferral


def _step(source: StepSource) -> Optional[str]:
    return source() if callable(source) else source


def _retry_after(headers: Any, default: float) -> float:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else default
    except (TypeError, ValueError):
        return default


try:
    from requests.adapters import HTTPAdapter

    class BudgetAdapter(HTTPAdapter):
        """A ``requests`` transport adapter that acquires before each request."""

        def __init__(self, client: BudgetClient, *, step: StepSource = None, default_backoff_seconds: float = 30.0,
                     **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.budget = client
            self.step = step
            self.default_backoff_seconds = default_backoff_seconds

        def send(self, request: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            decision = self.budget.acquire(request.url, step=_step(self.step))
            if isinstance(decision, Deferral):
                raise EgressDeferred(decision)
            response = super().send(request, **kwargs)
            if response.status_code in BACKOFF_STATUSES:
                self.budget.backoff(request.url, _retry_after(response.headers, self.default_backoff_seconds),
                                    f"http_{response.status_code}")
            return response

except ImportError:  # pragma: no cover - requests is optional
    BudgetAdapter = None  # type: ignore[assignment,misc]


try:
    import httpx

    class BudgetTransport(httpx.BaseTransport):
        """An ``httpx`` transport that acquires before each request (wraps another transport)."""

        def __init__(self, client: BudgetClient, *, transport: Optional[httpx.BaseTransport] = None,
                     step: StepSource = None, default_backoff_seconds: float = 30.0) -> None:
            self.budget = client
            self.inner = transport or httpx.HTTPTransport()
            self.step = step
            self.default_backoff_seconds = default_backoff_seconds

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            decision = self.budget.acquire(str(request.url), step=_step(self.step))
            if isinstance(decision, Deferral):
                raise EgressDeferred(decision)
            response = self.inner.handle_request(request)
            if response.status_code in BACKOFF_STATUSES:
                self.budget.backoff(str(request.url), _retry_after(response.headers, self.default_backoff_seconds),
                                    f"http_{response.status_code}")
            return response

        def close(self) -> None:
            self.inner.close()

except ImportError:  # pragma: no cover - httpx is optional
    BudgetTransport = None  # type: ignore[assignment,misc]

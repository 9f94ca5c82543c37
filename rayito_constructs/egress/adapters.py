"""The chokepoint: HTTP client adapters that take a token before every request leaves.

    session = budget_session(client, step=lambda: current_step())     # http:// and https://
    httpx.Client(transport=BudgetTransport(client))
    httpx.AsyncClient(transport=AsyncBudgetTransport(client))

Every request that leaves through them pays: each redirect hop (``requests`` and ``httpx`` send
each hop through the adapter), each retry of ``urllib3``'s ``Retry`` (the adapter's
``max_retries``), ``http`` and ``https``. A request without a token never leaves: the adapter
raises :class:`EgressDeferred` carrying the :class:`Deferral` (target, ``retry_after_seconds``,
reason), so the caller (the agent's scheduler) decides what to do. A store problem is a
``limiter_unavailable`` deferral, never the store's exception. A 429 or 503 puts the target in
backoff for every holder of the envelope, for its ``Retry-After`` (seconds or an HTTP date, capped
at the client's ``max_backoff_seconds``) or ``default_backoff_seconds``.
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Optional, Union

from .client import BACKOFF, INVALID_TARGET_KEY, BudgetClient, Deferral
from ..model.egress_targets import TargetError, Url, from_parts

StepSource = Union[None, str, Callable[[], Optional[str]]]
BACKOFF_STATUSES = (429, 503)
DEFAULT_BACKOFF_SECONDS = 30.0


class EgressDeferred(Exception):
    """The request was not sent: its target has no budget now (or the budget cannot be asked)."""

    def __init__(self, deferral: Deferral) -> None:
        super().__init__(f"{deferral.target}: {deferral.reason}, retry after {deferral.retry_after_seconds:.3f} s")
        self.deferral = deferral


def _step(source: StepSource) -> Optional[str]:
    return source() if callable(source) else source


def retry_after_seconds(headers: Any, *, default: float, cap: float, now: float) -> float:
    """Seconds a response's ``Retry-After`` asks for: ``delay-seconds`` (digits only) or an
    HTTP-date (measured against the response's own ``Date`` when it has one, so the server's clock
    is compared with itself), capped at ``cap``; a date in the past is 0. Missing or not one of
    the two forms (``-5``, ``1e9``, ``inf``, ``soon``) is ``default``."""
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return min(default, cap)
    text = str(value).strip()
    if re.fullmatch(r"[0-9]+", text):
        return float(min(int(text[:12]), cap)) if len(text) <= 12 else cap
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return min(default, cap)
    if when.tzinfo is None:
        return min(default, cap)  # an HTTP-date is GMT; without a zone it is not one
    reference = now
    date = headers.get("Date")
    if date:
        try:
            sent = parsedate_to_datetime(str(date))
            if sent.tzinfo is not None:
                reference = sent.timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            pass
    return max(0.0, min(when.timestamp() - reference, cap))


class _Gate:
    """What the adapters share: acquire or raise, and back off on 429/503."""

    def __init__(self, client: BudgetClient, step: StepSource, default_backoff_seconds: float) -> None:
        self.budget = client
        self.step = step
        self.default_backoff_seconds = default_backoff_seconds

    def pay(self, url: Union[Url, str]) -> None:
        decision = self.budget.acquire(url, step=_step(self.step))
        if isinstance(decision, Deferral):
            raise EgressDeferred(decision)

    def answered(self, url: Union[Url, str], status: int, headers: Any) -> Optional[float]:
        """After a response: a 429/503 backs the target off; returns the seconds (None otherwise)."""
        if status not in BACKOFF_STATUSES:
            return None
        seconds = retry_after_seconds(headers, default=self.default_backoff_seconds,
                                      cap=self.budget.max_backoff_seconds, now=self.budget._clock())
        if seconds > 0:  # pragma: no branch - "Retry-After: 0" asks for no wait (tested through retry_after_seconds)
            self.budget.backoff(url, seconds, f"http_{status}")
        return seconds

    def refuse(self, url: Union[Url, str], seconds: float, status: int) -> None:
        """A retry the target asked to wait for does not wait inside the HTTP client: the caller
        gets the deferral now."""
        target = url.origin if isinstance(url, Url) else INVALID_TARGET_KEY  # never the URL: see acquire
        deferral = Deferral(target, seconds, BACKOFF, 0.0, 0, _step(self.step), f"http_{status}")
        raise EgressDeferred(self.budget._tell(deferral))  # type: ignore[arg-type]


def _url_of(scheme: str, host: str, port: Optional[int], path: str, query: str, text: str) -> Union[Url, str]:
    try:
        return from_parts(scheme, host, port, path, query)
    except TargetError:
        return text  # acquire says why it is not a target


try:
    from requests.adapters import HTTPAdapter
    from urllib3.util import parse_url
    from urllib3.util.retry import Retry

    @dataclass
    class _InFlight:
        gate: _Gate
        url: Union[Url, str]

    _IN_FLIGHT: contextvars.ContextVar[Optional[_InFlight]] = contextvars.ContextVar("rayito_egress", default=None)

    class _PaidRetry(Retry):
        """urllib3's Retry, where every retry pays before it is sent."""

        def sleep(self, response: Any = None) -> None:
            flight = _IN_FLIGHT.get()
            if flight is None:  # pragma: no cover - only the adapter installs this Retry
                return super().sleep(response)
            if response is not None:
                seconds = flight.gate.answered(flight.url, response.status, response.headers)
                if seconds:
                    flight.gate.refuse(flight.url, seconds, response.status)
            super().sleep(response)
            flight.gate.pay(flight.url)

    def _paid(retries: Retry) -> Retry:
        paid = _PaidRetry.__new__(_PaidRetry)
        paid.__dict__.update(retries.__dict__)
        return paid

    class BudgetAdapter(HTTPAdapter):
        """A ``requests`` transport adapter that acquires before each request and each retry.
        Mount it for both schemes (:func:`budget_session` does)."""

        def __init__(self, client: BudgetClient, *, step: StepSource = None,
                     default_backoff_seconds: float = DEFAULT_BACKOFF_SECONDS, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.max_retries = _paid(self.max_retries)
            self.gate = _Gate(client, step, default_backoff_seconds)
            self.budget = client

        def send(self, request: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            parts = parse_url(request.url)
            url = _url_of(parts.scheme or "", parts.host or "", parts.port, parts.path or "/", parts.query or "",
                          request.url)
            self.gate.pay(url)
            token = _IN_FLIGHT.set(_InFlight(self.gate, url))
            try:
                response = super().send(request, **kwargs)
            finally:
                _IN_FLIGHT.reset(token)
            self.gate.answered(url, response.status_code, response.headers)
            return response

    def budget_session(client: BudgetClient, *, session: Any = None, step: StepSource = None, **adapter_kwargs: Any) -> Any:
        """A ``requests.Session`` (or yours) with :class:`BudgetAdapter` on ``http://`` and
        ``https://``: every hop of a redirect pays, whichever scheme it goes to."""
        import requests

        session = session if session is not None else requests.Session()
        adapter = BudgetAdapter(client, step=step, **adapter_kwargs)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session

except ImportError:  # pragma: no cover - requests is optional (the "http" extra)
    BudgetAdapter = None  # type: ignore[assignment,misc]
    budget_session = None  # type: ignore[assignment]


try:
    import httpx

    def _httpx_url(request: httpx.Request) -> Union[Url, str]:
        u = request.url
        path, _, query = u.raw_path.decode("ascii", "replace").partition("?")
        return _url_of(u.scheme, u.raw_host.decode("ascii", "replace"), u.port, path, query, str(u))

    class BudgetTransport(httpx.BaseTransport):
        """An ``httpx`` transport that acquires before each request (each redirect hop included);
        wraps another transport. Connect retries of ``httpx.HTTPTransport(retries=...)`` are not
        charged: they never reached the target."""

        def __init__(self, client: BudgetClient, *, transport: Optional[httpx.BaseTransport] = None,
                     step: StepSource = None, default_backoff_seconds: float = DEFAULT_BACKOFF_SECONDS) -> None:
            self.budget = client
            self.inner = transport or httpx.HTTPTransport()
            self.gate = _Gate(client, step, default_backoff_seconds)

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            url = _httpx_url(request)
            self.gate.pay(url)
            response = self.inner.handle_request(request)
            self.gate.answered(url, response.status_code, response.headers)
            return response

        def close(self) -> None:
            self.inner.close()

    class AsyncBudgetTransport(httpx.AsyncBaseTransport):
        """:class:`BudgetTransport` for ``httpx.AsyncClient``: the store is asked in a worker
        thread, so the event loop keeps running while a token is taken."""

        def __init__(self, client: BudgetClient, *, transport: Optional[httpx.AsyncBaseTransport] = None,
                     step: StepSource = None, default_backoff_seconds: float = DEFAULT_BACKOFF_SECONDS) -> None:
            self.budget = client
            self.inner = transport or httpx.AsyncHTTPTransport()
            self.gate = _Gate(client, step, default_backoff_seconds)

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            import anyio.to_thread

            url = _httpx_url(request)
            step = _step(self.gate.step)  # read in the caller's context, not the worker thread's
            decision = await anyio.to_thread.run_sync(lambda: self.budget.acquire(url, step=step))
            if isinstance(decision, Deferral):
                raise EgressDeferred(decision)
            response = await self.inner.handle_async_request(request)
            if response.status_code in BACKOFF_STATUSES:
                await anyio.to_thread.run_sync(self.gate.answered, url, response.status_code, response.headers)
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

except ImportError:  # pragma: no cover - httpx is optional (the "http" extra)
    BudgetTransport = None  # type: ignore[assignment,misc]
    AsyncBudgetTransport = None  # type: ignore[assignment,misc]

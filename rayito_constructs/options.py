"""The fleet options of the product page: one typed model per table of ``rayito-agent.toml``.

Every default and limit here is the product page's ("Several sessions and several VMs", "The
options"). The models are strict: a string where a number belongs is an error, not a guess.
Cross-field rules (``min_vms <= max_vms``, ``warm_vms <= max_vms - min_vms``, the
``max_concurrency`` cap of the memory size) live in :mod:`rayito_constructs.project`, which sees
every table at once.
"""

from __future__ import annotations

import re
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .rates import MAX_BURST, RateError, parse_rate

#: The documented MicroVM size classes (``resources[0].minimumMemoryInMiB`` of an image).
MEMORY_CLASSES_MIB = (512, 1024, 2048, 4096, 8192)
DEFAULT_MEMORY_MIB = 2048

MAX_VMS_LIMIT = 64
QUEUE_MAX_LIMIT = 256
QUEUE_TIMEOUT_LIMIT = 900
SCALE_IN_MINIMUM = 60
IDLE_MINIMUM = 60  # IdlePolicy.maxIdleDurationSeconds has a minimum of 60 in the service model
MICROVM_MAX_LIFETIME_SECONDS = 28_800  # a MicroVM lives at most 8 hours


def vcpus_for(memory_mib: int) -> int:
    """The vCPUs the page counts for a memory size: one per 2 GiB, and one below 2 GiB."""
    return max(1, memory_mib // 2048)


def max_concurrency_limit(memory_mib: int) -> int:
    """Sessions one VM admits: 8 connections per vCPU minus the one the service keeps for /ping."""
    return 8 * vcpus_for(memory_mib) - 1


_DURATION = re.compile(r"^\s*(\d+)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)?\s*$", re.I)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(value: object) -> object:
    """``"15m"`` → 900, ``"90"`` → 90, ``"none"`` → None; anything else is left for the model."""
    if isinstance(value, str):
        if value.strip().lower() in {"none", "off", "never"}:
            return None
        match = _DURATION.match(value)
        if match:
            unit = (match.group(2) or "s")[0].lower()
            return int(match.group(1)) * _UNIT_SECONDS[unit]
    return value


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ServeOptions(_Options):
    """How one VM serves sessions (the ``[serve]`` table)."""

    max_concurrency: int = Field(1, ge=1)
    """Sessions at a time in one VM (``--max-sessions``). Default: 1. Limit: 7 with 2 GiB, 15 with
    4 GiB, 31 with 8 GiB (8 connections per vCPU minus one)."""

    queue_max: int = Field(0, ge=0, le=QUEUE_MAX_LIMIT)
    """Requests that wait in the host queue when the VM is full (``--queue``). Default: 0, an
    immediate 429. Limit: 256."""

    queue_timeout_seconds: int = Field(30, ge=1, le=QUEUE_TIMEOUT_LIMIT)
    """How long a request waits in the queue (``--queue-timeout``). Default: 30. Limit: 900."""

    @field_validator("queue_timeout_seconds", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value


class ScalingOptions(_Options):
    """How many VMs the fleet keeps (the ``[scaling]`` table)."""

    min_vms: int = Field(1, ge=0)
    """VMs always alive (``--min-vms``). Default: 1."""

    max_vms: int = Field(1, ge=1, le=MAX_VMS_LIMIT)
    """VMs at most (``--max-vms``). Default: 1. Limit: 64."""

    warm_vms: int = Field(0, ge=0)
    """Parked (suspended) slots that absorb a spike (``--warm``). Default: 0. Limit:
    ``max_vms - min_vms``."""

    sessions: Literal["shared", "dedicated"] = "shared"
    """``shared`` (several sessions per VM) or ``dedicated`` (one VM per session)."""

    scale_in_after_seconds: int = Field(900, ge=SCALE_IN_MINIMUM, le=MICROVM_MAX_LIFETIME_SECONDS)
    """Idle time after which a VM above ``min_vms`` ends by itself (``--scale-in-after``).
    Default: 900. At least 60."""

    idle: Optional[int] = Field(None, ge=IDLE_MINIMUM, le=MICROVM_MAX_LIFETIME_SECONDS)
    """Idle seconds after which a VM is suspended and resumed when called (``--idle``).
    Default: none, no suspension. At least 60 (the service's IdlePolicy minimum)."""

    @field_validator("scale_in_after_seconds", "idle", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value


class ImageOptions(_Options):
    """The MicroVM image the fleet runs (the ``[image]`` table)."""

    memory_mib: Literal[512, 1024, 2048, 4096, 8192] = DEFAULT_MEMORY_MIB
    """Baseline memory of each VM (``--memory``), one of the documented size classes."""

    architecture: Literal["ARM_64", "X86_64"] = "ARM_64"
    """CPU architecture of the image. Default: ``ARM_64``."""

    version: Optional[str] = Field(None, min_length=1, max_length=2048, pattern=r"^\S+$")
    """Image version to run (``major.minor``). Default: the latest active version."""


class EgressBudgetOptions(_Options):
    """One per-target rate envelope (a ``[[egress.budgets]]`` entry)."""

    target: str
    """``https://api.example.com``, with an optional path class (``/v1/chat``) or query class
    (``?model``)."""
    rate: Union[str, int, float]
    """``"60/minute"``, ``"10/second"``..., or a number per second."""
    burst: int = Field(1, ge=1, le=MAX_BURST)

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        from .egress.targets import declared_target

        return declared_target(value)

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: Union[str, int, float]) -> Union[str, int, float]:
        try:
            parse_rate(value)
        except RateError as exc:  # the report puts the value in front of the reason
            raise ValueError(exc.reason) from None
        return value

    @property
    def rate_per_second(self) -> float:
        return parse_rate(self.rate)


class EgressOptions(_Options):
    """Where the agent may send requests, and how fast (the ``[egress]`` table)."""

    allow: tuple[str, ...] = ()
    """Hosts the agent may reach (``--allow-out``). Default: no allow-list."""
    budgets: tuple[EgressBudgetOptions, ...] = ()
    """Per-target rate envelopes (``[[egress.budgets]]``). Default: none (no EgressBudget)."""
    default_rate: Union[str, int, float] = "60/minute"
    """Envelope of a target no budget declares. Default: 60/minute."""
    default_burst: int = Field(5, ge=1, le=MAX_BURST)

    @field_validator("default_rate")
    @classmethod
    def _default_rate(cls, value: Union[str, int, float]) -> Union[str, int, float]:
        return EgressBudgetOptions._rate(value)

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, value: object) -> object:
        return tuple(value) if isinstance(value, list) else value


class GatewayOptions(_Options):
    """One model or tool gateway the fleet opens for each VM (a ``[[gateways]]`` entry)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    preset: Optional[str] = Field(None, min_length=1, max_length=64)
    upstream: Optional[str] = Field(None, min_length=1, max_length=2048)
    secret_env: tuple[str, ...] = ()
    """Names of secret environment variables the gateway injects upstream (names only)."""

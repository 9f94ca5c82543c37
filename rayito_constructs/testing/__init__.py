"""Test doubles that speak real AWS wire protocols: ``MicrovmsEmulator`` (Lambda MicroVMs)."""

from .microvms import DEFAULT_RATE_LIMITS, Fault, MicrovmsEmulator, RealClock, VirtualClock

__all__ = ["DEFAULT_RATE_LIMITS", "Fault", "MicrovmsEmulator", "RealClock", "VirtualClock"]

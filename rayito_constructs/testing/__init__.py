"""Test doubles that speak real AWS wire protocols: ``MicrovmsEmulator`` (Lambda MicroVMs).

``MicrovmsEmulator`` is the service on a socket (``microvms.py``); ``MicrovmsBackend`` is its state
and rules, callable without HTTP (``backend.py``). The behaviours measured on the service each have
a module (``throttling``, ``consistency``, ``images``, ``lifecycle``, ``faults``); ``measured``
holds every default with the measurement it rests on.
"""

from .backend import MicrovmsBackend, RequestRecord
from .clock import RealClock, VirtualClock, sdk_sleeps_on
from .faults import Fault
from .measured import PROFILES, Profile
from .microvms import DEFAULT_RATE_LIMITS, MicrovmsEmulator

__all__ = [
    "DEFAULT_RATE_LIMITS", "Fault", "MicrovmsBackend", "MicrovmsEmulator", "PROFILES", "Profile", "RealClock",
    "RequestRecord", "VirtualClock", "sdk_sleeps_on",
]

"""What the emulator's defaults rest on: each one with the measurement (or document) it comes from.

Sources (``shared/research/rayito-ground-truth.md``, "GT" below, whose labels are kept):
**[M date]** measured on a real AWS account by the Rayito authors; **[model]** botocore's
``lambda-microvms`` service model; **[docs]** the AWS documentation; **[3rd]** a third party's
measurement. Where documentation and measurement disagree, the measurement wins and the
``documented`` profile keeps the documented behaviour (see :class:`Profile`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# --------------------------------------------------------------------------------- lifecycle timings

#: RunMicrovm -> RUNNING. [M 2026-09-15] first HTTP 200 on the endpoint p50 1.85 s / p95 2.13 s
#: sequential, p50 2.53 s with 20 in parallel (GT §3, Notes Q2/Q3). A third party saw RUNNING at
#: about +12 s (microvms.md §1.1) with a heavier image: pass ``pending_seconds=12`` for that.
PENDING_SECONDS = 2.0

#: RunMicrovm -> the product's agent ready (rayd's Health with ``agent_ready``). [M 2026-09-16]
#: p50 2.33 s with the full image (GT §3, Notes Q42): about 0.5 s after the VM serves HTTP.
AGENT_READY_AFTER_RUNNING_SECONDS = 2.33 - 1.85
#: From rayd ready to the agent host's ready marker: the network policy and gateways, the host's
#: configuration written, the host started (Python, the app behind it) and its marker polled every
#: 0.5 s. Not measured on AWS; measured here with the stand-in rayd running the product's real
#: agent host and the example's app (tests/test_fleet_product.py prints it): 1.0-1.6 s.
AGENT_HOST_START_SECONDS = 1.5
#: A parked slot's warming after rayd is ready: the pool's settling cell (one trivial Code.Execute)
#: and the network policy. Not measured on AWS; the stand-in answers it in under 0.1 s.
WARM_SETTLE_SECONDS = 0.3

#: The first launches of a freshly published image version are much slower. [M 2026-10-07]
#: ``create()`` took 48-65 s for the first 3 VMs of v1 and 26-63 s for the first 5 of v2, against
#: 6.9-12.5 s afterwards (GT §3, Q146). The emulator draws each from this range (seeded).
FRESH_VERSION_LAUNCH_SECONDS = (26.0, 65.0)
#: How many first launches of a fresh version are slow: the measurement saw 3 and 5 (GT §3).
FRESH_VERSION_LAUNCHES = 5

#: SuspendMicrovm -> SUSPENDED. [M 2026-09-15/16] 1.4 s (2 GB); later runs 1.01-1.04 s and
#: 1.37-1.49 s (GT §3, Q38/Q42).
SUSPENDING_SECONDS = 1.4

#: ResumeMicrovm -> RUNNING. [M 2026-09-15/16] the VM stays SUSPENDED while its ``/resume`` hook
#: runs and becomes RUNNING when it returns; the first 200 arrives 1.2 s after the call
#: (GT §3, Notes §5, Q4/Q40). Auto-resume through the endpoint: 1.1-1.6 s.
RESUME_SECONDS = 1.2

#: After the ``/resume`` hook returned: [M 2026-09-24] GetMicrovm read 0.1-0.5 s after ``/resume``
#: returned 200 **still said PENDING** (GT §3, Notes §5), while the endpoint already answered 200
#: (the first 200 at 1.2 s, above). So the control plane shows SUSPENDED -> PENDING -> RUNNING
#: and the VM serves from the hook's return; PENDING lasts at least the 0.5 s of the latest read.
RESUME_PENDING_SECONDS = 0.5

#: TerminateMicrovm -> TERMINATED. [3rd] TERMINATING at +1 s, TERMINATED at +3 s
#: (microvms.md §1.1); [M 2026-09-15] TERMINATING at 0.14 s, then TERMINATED (GT §3).
TERMINATING_SECONDS = 3.0

#: How long TERMINATED VMs stay listed (and readable by GetMicrovm). [M 2026-09-15] "at least
#: about 20 minutes": 45 TERMINATED entries of one image after a run (GT §4, Q13). The earlier
#: default (600 s) was shorter than what was observed.
TERMINATED_LINGER_SECONDS = 1200.0

#: When the app (PID 1) exits, the endpoint answers 502 at once but GetMicrovm says RUNNING for
#: about 15 s, then TERMINATING/TERMINATED with ``Container Stopped with Exit Code: N``;
#: ``terminatedAt`` 15.3-18 s after the exit. [M 2026-09-22/24] (GT §3, Q58/Q63)
APP_EXIT_REPORT_SECONDS = 15.0

#: A ``/suspend`` hook answering 500 terminates the VM: the call is accepted, and within < 5 s the
#: state is TERMINATED (no retries seen). [M 2026-09-15] (GT §3, Q10). The emulator moves the VM
#: to TERMINATING this long after the call (then ``TERMINATING_SECONDS`` to TERMINATED: 4 s).
SUSPEND_HOOK_FAILURE_SECONDS = 1.0

# --------------------------------------------------------------------------------- state reasons

#: [M 2026-09-15] after TerminateMicrovm (GT §3).
REASON_TERMINATED = "Success."
#: [M 2026-10-02] maximumDurationInSeconds expiry (GT §3, Q105).
REASON_MAX_LIFETIME = "MicroVM exceeded maximum lifetime."
#: [M 2026-09-15] (GT §3, Q10).
REASON_SUSPEND_HOOK = (
    "Suspend lifecycle hook returned HTTP status {status}. Please check your hook endpoint and "
    "application logs for more details."
)
#: [M 2026-09-22/24] (GT §3, Q58/Q63).
REASON_APP_EXIT = "Container Stopped with Exit Code: {code}"
#: Not measured: the idle policy's end after ``suspendedDurationSeconds``.
REASON_IDLE = "MicroVM exceeded suspended duration."

# --------------------------------------------------------------------------------- consistency

#: GetMicrovm and ListMicrovms are eventually consistent [model: "determine readiness by
#: connecting to the endpoint"]. [M 2026-09-15] right after TerminateMicrovm returns, GetMicrovm
#: still says RUNNING, TERMINATING at 0.14 s; [M 2026-09-24] GetMicrovm 0.1-0.5 s after
#: ``/resume`` returned still said PENDING (GT §3). Each read sees the service as it was up to
#: this long ago (seeded); a VM started within that window may be missing from a list.
CONSISTENCY_SECONDS = 0.5

# --------------------------------------------------------------------------------- images

#: CREATING/UPDATING while a version builds. [M] 135-145 s (probe image), 185-217 s (full Python
#: image), 271-320 s (agent template) (GT §7, Q34/Q83).
IMAGE_BUILD_SECONDS = 180.0
#: DeleteMicrovmImageVersion (even of an ACTIVE version) puts the image in UPDATING and back to
#: UPDATED in about 5.4 s; a second delete meanwhile is a ConflictException. [M 2026-09-16]
#: (GT §7, Notes §4, Q49)
IMAGE_VERSION_DELETE_SECONDS = 5.4
#: DeleteMicrovmImage: DELETING at once [M 2026-09-16]; how long until it is gone is not measured.
IMAGE_DELETE_SECONDS = 5.4
#: [M 2026-09-30] only these sizes; others are a synchronous ValidationException (GT §7, Q87).
MEMORY_SIZES_MIB = (512, 1024, 2048, 4096, 8192)
#: [docs] 100 images per account, 50 versions per image; [M 2026-09-30] 10 concurrent builds in
#: us-east-1 (the 11th create: ServiceQuotaExceededException "maximum number of concurrent builds",
#: GT §2, Q83), 5 in other regions.
MAX_IMAGES = 100
MAX_VERSIONS_PER_IMAGE = 50
MAX_CONCURRENT_BUILDS = 10
LARGE_REGIONS = ("us-east-1", "us-east-2", "us-west-2", "ap-northeast-1")

#: The AWS-managed base images (ListManagedMicrovmImages/ListManagedMicrovmImageVersions), by name
#: (the ARN is ``arn:aws:lambda:<region>:aws:microvm-image:<name>``), each with its versions and
#: their status. [M 2026-09-15/16] ``list-managed-microvm-image-versions`` lists ``0`` and ``1``
#: for ``al2023-1`` (GT §7, Q52/Q115; the versions as the notes write them). Their status was not
#: recorded: AVAILABLE is assumed (the model's statuses: AVAILABLE, DEPRECATED, RECALLED). No other
#: managed image is known. ``supportedCpuConfigurations`` was not recorded and is left out.
MANAGED_IMAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "al2023-1": (("0", "AVAILABLE"), ("1", "AVAILABLE")),
}
#: When the managed images were created: not measured; the first regions opened on 2026-06-22
#: [docs] (GT §8).
MANAGED_IMAGES_CREATED_AT = 1_782_086_400.0  # 2026-06-22T00:00:00Z

# --------------------------------------------------------------------------------- quotas

#: [docs] default TPS (burst = rate); [M 2026-09-15] the same values applied in the test account
#: (GT §2, Q9). ListMicrovms has no published rate ([M 2026-09-16] it did throttle while several
#: suites ran at once, Q57): 10/10 is an assumption.
DOCUMENTED_RATE_LIMITS: dict[str, tuple[float, float]] = {
    "RunMicrovm": (5, 5),
    "ResumeMicrovm": (5, 5),
    "SuspendMicrovm": (2, 2),
    "TerminateMicrovm": (10, 10),
    "GetMicrovm": (100, 100),
    "CreateMicrovmAuthToken": (50, 50),
    "CreateMicrovmShellAuthToken": (5, 5),
    "ListMicrovms": (10, 10),
}
#: Any operation not listed above (not published; an assumption).
OTHER_RATE_LIMIT = (10.0, 10.0)
QUOTA_CODES = {
    "RunMicrovm": "L-535CA9B6",
    "ResumeMicrovm": "L-118C44B3",
    "SuspendMicrovm": "L-90045317",
    "TerminateMicrovm": "L-74787B8A",
    "GetMicrovm": "L-CE98C9E3",
    "CreateMicrovmAuthToken": "L-7712260B",
    "CreateMicrovmShellAuthToken": "L-B78D2ECC",
}
MEMORY_QUOTA_CODE = "L-CD1C0CC4"
#: [docs] the memory quota over RUNNING + SUSPENDED VMs: 1,024 GB in the large regions
#: (us-east-1, us-east-2, us-west-2, ap-northeast-1; the applied value measured in us-east-1,
#: GT §2), 400 GB elsewhere. Counted in MiB, as the emulator counts VM memory.
MEMORY_QUOTA_MIB = 1024 * 1024
MEMORY_QUOTA_MIB_OTHER_REGIONS = 400 * 1024


def memory_quota_mib(region: str) -> int:
    """The default memory quota of a region ([docs], GT §2)."""
    return MEMORY_QUOTA_MIB if region in LARGE_REGIONS else MEMORY_QUOTA_MIB_OTHER_REGIONS
MAX_DURATION_SECONDS = 28_800
#: [docs] ``idlePolicy.maxIdleDurationSeconds`` at most 28,800 (8 h); botocore's model has only the
#: minimum (60), so the emulator enforces the documented maximum itself (GT §5, Notes §2).
MAX_IDLE_SECONDS = 28_800

#: Above the documented rate the service slows down instead of refusing. [M 2026-09-15/16] 20
#: simultaneous RunMicrovm: 20/20 OK, 0 ThrottlingException; raw bursts of 5, 10 and 20 (single
#: attempt, no client bucket): 70/70 OK, 0 ThrottlingException; the raw-20 latencies split into
#: ten at 0.20-0.25 s and ten at 1.16-1.20 s (GT §2, Q3/Q43). So twice the documented burst is
#: answered at once (ten of twenty, against RunMicrovm's documented burst of 5) ...
UNHELD_BURSTS = 2.0
#: ... the requests past that are held about a second (1.16-1.20 s less the 0.20-0.25 s of an
#: answer at once) ...
HOLD_SECONDS = 1.0
#: ... and up to this many times the documented burst can be held at once (refilled at the
#: documented rate): with RunMicrovm's 5/5, a burst of 20 is 10 answered at once and 10 held, none
#: refused, as measured. Past that, 429 with ``retryAfterSeconds`` (a burst of 40 at one instant:
#: 20 served, 20 refused, as before this split was measured). What the service does under a
#: sustained overload was not measured; this is the smallest surge that fits the measurement.
#:
#: Only RunMicrovm's bursts were measured. Both allowances apply to every held operation alike,
#: as the hold itself does; that is also what the one other measurement supports: [M 2026-09-16]
#: three SuspendMicrovm in a row on a SUSPENDED VM were answered in 0.15-0.17 s each (GT §3, Q38),
#: which SuspendMicrovm's 2/s burst would hold but twice it (4) does not. The alternative, not
#: charging no-op suspends/resumes to the quota at all, is not what was measured (nothing says the
#: quota skips them; a service's rate limit counts requests before it reads any state), so they
#: are charged like any other request.
SURGE_BURSTS = 2.0
#: Only ListMicrovms was ever seen answering 429 (Q57): it is not held.
NOT_HELD = ("ListMicrovms",)


@dataclass(frozen=True)
class Profile:
    """A set of behaviours where the documentation and the measurements disagree.

    ``measured`` (the default) behaves as the service was measured to (twice the documented
    burst answered at once, then held, then 429); ``documented`` follows the AWS documentation
    strictly: every request above the quota is answered 429 at once,
    SuspendMicrovm/ResumeMicrovm answer 409 unless the VM is RUNNING/SUSPENDED, and RunMicrovm
    answers 409 while the image is CREATING/UPDATING.
    """

    name: str
    hold_seconds: float
    """How long a request above the documented rate is held before it is served (0: never)."""
    surge_bursts: float
    """How many documented bursts can be held at once, per operation."""
    idempotent_suspend_resume: bool
    """Suspend on SUSPENDED and resume on RUNNING answer 200 ([M] Q38) instead of 409 ([docs])."""
    not_held: tuple[str, ...] = field(default=NOT_HELD)
    unheld_bursts: float = 1.0
    """How many documented bursts are answered at once, unheld ([M] Q43: 2; [docs]: 1)."""
    run_while_image_busy: bool = True
    """RunMicrovm launches the latest ACTIVE version while the image is CREATING/UPDATING (a
    version building or being deleted). [docs] say it must be CREATED|UPDATED to launch (GT §7);
    ``documented`` refuses it (409). Not measured either way: see ``RUN_WHILE_IMAGE_BUSY``."""

    def but(self, **changes: object) -> "Profile":
        return replace(self, **changes)  # type: ignore[arg-type]


#: [docs/model] "To launch, all three must hold: image CREATED|UPDATED, version SUCCESSFUL, status
#: ACTIVE" (GT §7): documented, never measured. The measured profile keeps launching the latest
#: ACTIVE version while the image is UPDATING: nothing measured says the service refuses it, and
#: refusing would change every fleet's behaviour during every deploy (each UpdateMicrovmImage
#: leaves the image UPDATING for its 135-320 s build, each version delete for 5.4 s), on the
#: strength of a sentence alone. ``profile="documented"`` refuses it, to test a client against it.
RUN_WHILE_IMAGE_BUSY = True

PROFILES: dict[str, Profile] = {
    "measured": Profile("measured", HOLD_SECONDS, SURGE_BURSTS, True, unheld_bursts=UNHELD_BURSTS,
                        run_while_image_busy=RUN_WHILE_IMAGE_BUSY),
    "documented": Profile("documented", 0.0, 0.0, False, run_while_image_busy=False),
}


def profile(name: str | Profile) -> Profile:
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile: {name!r} is not one of {', '.join(PROFILES)}") from None


@dataclass
class Timings:
    """The lifecycle's timings, in seconds (every one configurable on the emulator)."""

    pending: float = PENDING_SECONDS
    fresh_launch: tuple[float, float] = FRESH_VERSION_LAUNCH_SECONDS
    fresh_launches: int = FRESH_VERSION_LAUNCHES
    suspending: float = SUSPENDING_SECONDS
    resume: float = RESUME_SECONDS
    resume_pending: float = RESUME_PENDING_SECONDS
    terminating: float = TERMINATING_SECONDS
    linger: float = TERMINATED_LINGER_SECONDS
    app_exit_report: float = APP_EXIT_REPORT_SECONDS
    suspend_hook_failure: float = SUSPEND_HOOK_FAILURE_SECONDS
    image_build: float = IMAGE_BUILD_SECONDS
    version_delete: float = IMAGE_VERSION_DELETE_SECONDS
    image_delete: float = IMAGE_DELETE_SECONDS

    def check(self) -> None:
        for name, value in self.__dict__.items():
            values = value if isinstance(value, tuple) else (value,)
            for v in values:
                if not isinstance(v, (int, float)) or v != v or v < 0 or v == float("inf"):
                    raise ValueError(f"{name}: {value!r} is not a finite number of seconds >= 0")
        low, high = self.fresh_launch
        if low > high:
            raise ValueError(f"fresh_launch: {self.fresh_launch} must be (low, high) with low <= high")

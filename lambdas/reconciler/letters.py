"""The dead-letter outbox: a slot's letter is written into the ledger with the DEAD slot and sent
once that write landed; one the queue refuses stays in the ledger and is sent again by the next
tick's first step. A letter of a slot a later spec drops moves to ``#stats`` (``letters``) in the
same write and is sent from there. Letters are at least once (SQS is): a letter the queue took whose
clearing write then fails is sent again, with the same ``letter_id``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from . import answers
from .core import Slot
from .ports import DeadLetters, Shell
from .timing import Deadline

#: The longest a dead letter's SendMessage may take (``aws.LETTER_CONFIG``: one attempt, 2 s to
#: connect, 3 s to read, and a margin): one is sent only with that much of the tick's time left.
LETTER_SEND_SECONDS = 6.0


def letter_id(fleet: str, letter: dict[str, Any]) -> str:
    """One id a dead-lettering (fleet, slot, generation, kind, errors): a reader drops a repeat."""
    return f"{fleet}:" + ":".join(str(letter.get(k)) for k in ("slot", "generation", "kind", "errors"))


@dataclass
class Outbox:
    """One tick's sending of dead letters."""

    shell: Shell
    deadline: Deadline
    send: Optional[DeadLetters]
    due: bool = True  # the ledger's unsent letters: sent by the tick's first step with time left
    blocked: bool = False  # a send failed in this tick: the others wait for the next one

    def flush(self, slots: dict[str, Slot], fresh: list[str], orphans: dict[str, Any]) -> None:
        """After a step's calls (a queue that hangs must not hold the runs back): the letters the
        step made, and once a tick every one the queue refused before (the slots' and ``orphans``,
        those of slots a spec dropped)."""
        if self.due:
            self.due = False
            self.send_slots(slots, sorted(slots))
            self.send_orphans(orphans)
        else:
            self.send_slots(slots, fresh)

    def send_slots(self, slots: dict[str, Slot], only: list[str]) -> None:
        for slot_id in sorted(only):
            slot = slots.get(slot_id)
            if slot is None or slot.letter is None or not self.time_left():
                continue
            if self.deliver(slot.letter):
                self.shell.write(slots, [replace(slot, letter=None)])

    def send_orphans(self, orphans: dict[str, Any]) -> None:
        if not orphans:
            return
        left = dict(orphans)
        for key in sorted(orphans):
            if self.time_left() and self.deliver(orphans[key]):
                del left[key]
        if left != orphans:
            self.shell.write({}, [], meta={"letters": left})
            orphans.clear()
            orphans.update(left)

    def time_left(self) -> bool:
        """Whether a letter may be sent now: none failed in this tick (a queue that hangs costs one
        send a tick, not one a letter), and the tick has the longest send left."""
        return not self.blocked and self.deadline.hard_left() >= LETTER_SEND_SECONDS

    def deliver(self, letter: dict[str, Any]) -> bool:
        """Whether the dead-letter queue took ``letter`` (True without a queue to send to)."""
        if not self.send:  # uncovered: every reconciler that dead-letters has a queue (the handler always sets one)
            return True
        fleet = self.shell.spec.fleet
        try:
            self.send({"fleet": fleet, "letter_id": letter_id(fleet, letter),
                       **{k: v for k, v in letter.items() if k != "time"}})
        except Exception as exc:  # noqa: BLE001 - any failure of the queue: told, kept, sent again
            self.blocked = True
            self.shell.emit({"event": "dead_letter_failed", "slot": letter.get("slot"), "code": answers.error_code(exc),
                             "error_message": str(exc)[:300], "reason": "kept in the ledger; sent again by the next tick"})
            return False
        return True

"""What CloudWatch takes, as plain values: the alarm actions an alarm holds and the retentions
CloudWatch Logs offers. Shared by the constructs (:mod:`.monitoring`) and the reading of ``cdk
synth`` context (:mod:`.overrides`), which must not import aws-cdk-lib to check a ``-c`` value.
"""

from __future__ import annotations

import re
from typing import Optional

#: An SNS topic ARN (topic names: 1-256 of letters, digits, ``-`` and ``_``; ``.fifo`` for FIFO).
#: ASCII only: a bare \d would take other scripts' digits (١٢٣...), which no account id has.
SNS_TOPIC_ARN = re.compile(r"^arn:aws[a-zA-Z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?\Z", re.ASCII)

#: Actions an alarm takes per state: "The actions (up to five) to execute when this alarm
#: transitions into an ALARM state" (CloudWatch, mon-put-metric-alarm; PutMetricAlarm's
#: ``AlarmActions`` holds at most 5).
MAX_ALARM_ACTIONS = 5

#: ``logs.RetentionDays`` in days (``None``: never expire), as CloudFormation's ``RetentionInDays``.
RETENTION_DAYS: dict[str, Optional[int]] = {
    "ONE_DAY": 1, "THREE_DAYS": 3, "FIVE_DAYS": 5, "ONE_WEEK": 7, "TWO_WEEKS": 14, "ONE_MONTH": 30,
    "TWO_MONTHS": 60, "THREE_MONTHS": 90, "FOUR_MONTHS": 120, "FIVE_MONTHS": 150, "SIX_MONTHS": 180,
    "ONE_YEAR": 365, "THIRTEEN_MONTHS": 400, "EIGHTEEN_MONTHS": 545, "TWO_YEARS": 731,
    "THREE_YEARS": 1096, "FIVE_YEARS": 1827, "SIX_YEARS": 2192, "SEVEN_YEARS": 2557,
    "EIGHT_YEARS": 2922, "NINE_YEARS": 3288, "TEN_YEARS": 3653, "INFINITE": None,
}

"""When a schedule fires: five-field cron in an IANA time zone (cronsim), or one instant.

Pure functions over datetimes; times are stored and compared in UTC. Daylight-saving gaps and
repeats are handled as cronsim documents them (as Debian's cron does): a fixed-time job in a
skipped hour runs once at the gap's end, one in a repeated hour runs once, at its first pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

# Iterating a schedule is bounded: a cron that matches rarely (Feb 29 on a Monday) still ends.
MAX_STEPS = 10_000


class InvalidSchedule(ValueError):
    """A schedule that cannot run: `code` is `invalid_schedule` or `invalid_timezone` (a 422)."""

    def __init__(self, code: str, message: str, field: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name` (an empty name is UTC); InvalidSchedule `invalid_timezone` otherwise."""
    if not name:
        return ZoneInfo("UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule("invalid_timezone", f"Unknown time zone {name!r}.", "timezone") from None


def check_cron(expr: str, tz: str) -> None:
    """InvalidSchedule unless `expr` is five cron fields that match some time in zone `tz`."""
    if len(expr.split()) != 5:
        raise InvalidSchedule(
            "invalid_schedule", "A cron schedule has five fields: minute hour day month weekday.", "cron"
        )
    try:
        next_after(expr, tz, datetime.now(UTC))
    except CronSimError as exc:
        raise InvalidSchedule("invalid_schedule", f"Invalid cron expression: {exc}", "cron") from None


def times(expr: str, tz: str, after: datetime) -> Iterator[datetime]:
    """The cron's times strictly after `after`, in UTC (CronSimError for a bad expression)."""
    local = after.astimezone(zone(tz)).replace(microsecond=0)
    for when in CronSim(expr, local):
        yield when.astimezone(UTC)


def next_after(expr: str, tz: str, after: datetime) -> datetime:
    """The cron's first time strictly after `after`, in UTC; InvalidSchedule if it never comes."""
    for when in times(expr, tz, after):
        return when
    raise InvalidSchedule("invalid_schedule", "The cron expression never matches a time.", "cron")


def count_between(expr: str, tz: str, start: datetime, end: datetime) -> int:
    """How many of the cron's times fall in (start, end], at most MAX_STEPS."""
    count = 0
    for when in times(expr, tz, start):
        if when > end or count >= MAX_STEPS:
            break
        count += 1
    return count

"""The queues page's chart of jobs finished per minute: bars laid out from the rows of
`search.JOB_COUNT_FINISHED_PER_MINUTE`, drawn as inline SVG by `_chart.html` (no script, no style
attribute: colours come from the stylesheet by class)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from jobcore.states import Status

# Bottom to top in a minute's stack.
STACK = (Status.COMPLETED, Status.FAILED, Status.DEAD_LETTER, Status.CANCELLED)

WIDTH, HEIGHT = 640.0, 220.0
LEFT, RIGHT, TOP, BOTTOM = 44.0, 8.0, 10.0, 26.0
PLOT_WIDTH = WIDTH - LEFT - RIGHT
PLOT_HEIGHT = HEIGHT - TOP - BOTTOM
# Share of a minute's slot its bar covers.
BAR_SHARE = 0.75


@dataclass(frozen=True)
class Bar:
    minute: datetime
    status: str
    count: int
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class Tick:
    label: str
    x: float
    y: float
    anchor: str = "middle"  # SVG text-anchor


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    peak: int  # the busiest minute's jobs
    total: int
    totals: dict[str, int]  # per status, in STACK order, those with any
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    width: float = WIDTH
    height: float = HEIGHT
    plot_left: float = LEFT
    plot_top: float = TOP
    plot_width: float = PLOT_WIDTH
    plot_height: float = PLOT_HEIGHT


def chart(rows: Iterable[tuple[datetime, str | None, int | None]]) -> Chart:
    """Lay out (minute, status, count) rows, every minute present (count None: none)."""
    counts: dict[datetime, dict[str, int]] = {}
    for minute, status, count in rows:
        per_status = counts.setdefault(minute, {})
        if status is not None and count:
            per_status[status] = per_status.get(status, 0) + int(count)
    minutes = sorted(counts)
    peak = max((sum(c.values()) for c in counts.values()), default=0)
    slot = PLOT_WIDTH / max(len(minutes), 1)
    bars = []
    order = [s.value for s in STACK]
    for index, minute in enumerate(minutes):
        # Statuses this chart does not know (none today) stack last, by name.
        stacked = sorted(counts[minute].items(), key=lambda kv: _rank(order, kv[0]))
        base = TOP + PLOT_HEIGHT
        for status, count in stacked:
            height = PLOT_HEIGHT * count / peak
            base -= height
            x = LEFT + index * slot + slot * (1 - BAR_SHARE) / 2
            bars.append(Bar(minute, status, count, x, base, slot * BAR_SHARE, height))
    totals: dict[str, int] = {}
    for bar in sorted(bars, key=lambda b: _rank(order, b.status)):
        totals[bar.status] = totals.get(bar.status, 0) + bar.count
    return Chart(bars, peak, sum(totals.values()), totals, _x_ticks(minutes, slot), _y_ticks(peak))


def _rank(order: list[str], status: str) -> tuple[int, str]:
    return (order.index(status) if status in order else len(order), status)


def _x_ticks(minutes: list[datetime], slot: float) -> list[Tick]:
    """A time label (UTC) every 15 minutes, and the last minute's (ending at the plot's edge)."""
    ticks = []
    last = len(minutes) - 1
    for index, minute in enumerate(minutes):
        label = minute.strftime("%H:%M")
        if index == last:
            ticks.append(Tick(label, LEFT + PLOT_WIDTH, HEIGHT - 8, "end"))
        elif index % 15 == 0 and last - index >= 8:
            ticks.append(Tick(label, round(LEFT + index * slot + slot / 2, 2), HEIGHT - 8))
    return ticks


def _y_ticks(peak: int) -> list[Tick]:
    """0, half the peak and the peak (whole numbers only)."""
    values = sorted({0, peak // 2, peak}) if peak else [0]
    bottom = TOP + PLOT_HEIGHT
    return [
        Tick(str(value), LEFT - 6, round(bottom - PLOT_HEIGHT * value / (peak or 1) + 4, 2), "end")
        for value in values
    ]


# --- each queue's last hour: two small charts per queue row -------------------------------

SPARK_WIDTH, SPARK_HEIGHT = 180.0, 36.0


@dataclass(frozen=True)
class Spark:
    """One queue's minutes as bars (`bars`: x, y, width, height) or a line (`points`, SVG
    polyline), scaled to `peak`; `last` is the current minute's value."""

    peak: float
    last: float
    total: float
    bars: list[tuple[float, float, float, float]] = field(default_factory=list)
    points: str = ""
    width: float = SPARK_WIDTH
    height: float = SPARK_HEIGHT


@dataclass(frozen=True)
class QueueHour:
    queue: str
    finished: Spark  # jobs finished per minute
    oldest: Spark  # oldest due, unfinished job's age in seconds at each minute's end


def queue_hours(rows: Iterable[tuple[str, datetime, int, float]]) -> list[QueueHour]:
    """Lay out `search.QUEUE_GET_HOUR`'s (queue, minute, finished, oldest age) rows."""
    by_queue: dict[str, list[tuple[datetime, int, float]]] = {}
    for queue, minute, finished, oldest in rows:
        by_queue.setdefault(queue, []).append((minute, int(finished), float(oldest)))
    hours = []
    for queue, minutes in sorted(by_queue.items()):
        minutes.sort()
        hours.append(
            QueueHour(queue, _bars([m[1] for m in minutes]), _line([m[2] for m in minutes]))
        )
    return hours


def _bars(values: list[int]) -> Spark:
    peak = max(values, default=0)
    slot = SPARK_WIDTH / max(len(values), 1)
    bars = []
    for index, value in enumerate(values):
        if value:
            height = max(SPARK_HEIGHT * value / peak, 1.0)
            x = round(index * slot + slot * 0.1, 2)
            bars.append(
                (x, round(SPARK_HEIGHT - height, 2), round(slot * 0.8, 2), round(height, 2))
            )
    return Spark(peak, values[-1] if values else 0, sum(values), bars)


def _line(values: list[float]) -> Spark:
    peak = max(values, default=0.0)
    step = SPARK_WIDTH / max(len(values) - 1, 1)
    points = " ".join(
        f"{index * step:.2f},{SPARK_HEIGHT - 1 - (SPARK_HEIGHT - 2) * v / (peak or 1):.2f}"
        for index, v in enumerate(values)
    )
    return Spark(peak, values[-1] if values else 0.0, sum(values), points=points)

"""Power rails: find the ones a device exposes in sysfs, sample them while profiling.

Three kinds of rail are read, in this order of preference (the first kind found is used alone,
so that nested rails are not counted twice):

- ``rapl``: Linux powercap RAPL zones, ``/sys/class/powercap/intel-rapl:N/energy_uj``, cumulative
  microjoule counters that wrap at ``max_energy_range_uj``. Only top-level zones are summed (their
  ``:N:M`` subzones are inside them); a ``psys`` zone, which covers the whole platform, is used
  alone when there is one.
- ``hwmon``: current/power monitors such as the Jetson INA3221, ``/sys/class/hwmon/hwmonN`` with
  ``powerK_input`` (microwatts) or ``inK_input`` (millivolts) and ``currK_input`` (milliamps).
  Where a channel is the board's input (a label such as ``VDD_IN`` or ``POM_5V_IN``) only that
  channel is read, since the others are inside it.
- ``battery``: Android's ``/sys/class/power_supply/battery/current_now`` (microamps, either sign)
  and ``voltage_now`` (microvolts); skipped while charging, when it measures the charger.

Every path is under a configurable ``root`` (``/`` on a device), so the parsing and arithmetic are
tested against a fake sysfs tree. This module uses the standard library only: the remote agent
runs it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ENERGY = "energy"  # cumulative microjoule counter
POWER = "power"  # instantaneous reading, converted to watts
_BOARD_INPUT = re.compile(r"(^|_)(IN|VIN|INPUT)$|^VDD_IN|^POM_5V_IN|total", re.IGNORECASE)


@dataclass(frozen=True)
class Rail:
    """One readable rail.

    Attributes:
        name: e.g. ``rapl:package-0``, ``hwmon:ina3221:VDD_IN``, ``battery``.
        kind: ``energy`` (a counter in microjoules) or ``power`` (a reading in watts).
        paths: The files read: one counter, one power file, or (voltage, current) files.
        scale: Multiplier from the raw reading (or the product of the two) to joules or watts.
        wrap: For counters, the value at which they wrap (``max_energy_range_uj``), else 0.
    """

    name: str
    kind: str
    paths: tuple[Path, ...]
    scale: float
    wrap: int = 0

    def read(self) -> float:
        """Joules so far (energy rails, before unwrapping) or watts now (power rails)."""
        values = [int(p.read_text().strip()) for p in self.paths]
        if len(values) == 2:
            return abs(values[0] * values[1]) * self.scale
        return abs(values[0]) * self.scale if self.kind == POWER else values[0] * self.scale


@dataclass(frozen=True)
class Rails:
    """The rails found on a device, and why others were skipped."""

    source: str  # "rapl" | "hwmon" | "battery" | "" when none
    rails: tuple[Rail, ...]
    skipped: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.rails)


def _text(p: Path) -> str:
    try:
        return p.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _readable(paths: Sequence[Path], skipped: list[str], name: str) -> bool:
    try:
        for p in paths:
            int(p.read_text().strip())
        return True
    except (OSError, ValueError) as e:
        skipped.append(f"{name}: cannot read {paths[0]} ({getattr(e, 'strerror', None) or e})")
        return False


def _rapl(root: Path, skipped: list[str]) -> list[Rail]:
    zones = sorted(
        p for p in (root / "sys/class/powercap").glob("intel-rapl:*") if p.name.count(":") == 1
    )
    rails = []
    for z in zones:
        name = _text(z / "name") or z.name
        counter = z / "energy_uj"
        if not counter.exists() or not _readable([counter], skipped, f"rapl:{name}"):
            continue
        wrap = int(_text(z / "max_energy_range_uj") or 0)
        rails.append(Rail(f"rapl:{name}", ENERGY, (counter,), 1e-6, wrap))
    psys = [r for r in rails if r.name == "rapl:psys"]
    return psys or rails


def _hwmon(root: Path, skipped: list[str]) -> list[Rail]:
    rails: list[Rail] = []
    for d in sorted((root / "sys/class/hwmon").glob("hwmon*")):
        chip = _text(d / "name") or d.name
        found: list[tuple[str, Rail]] = []
        for p in sorted(d.glob("power*_input")):
            k = p.name[len("power") : -len("_input")]
            label = _text(d / f"power{k}_label") or f"power{k}"
            if _readable([p], skipped, f"hwmon:{chip}:{label}"):
                found.append((label, Rail(f"hwmon:{chip}:{label}", POWER, (p,), 1e-6)))
        if not found and chip.lower().startswith("ina"):
            for v in sorted(d.glob("in*_input")):
                k = v.name[len("in") : -len("_input")]
                c = d / f"curr{k}_input"
                if not c.exists():
                    continue
                label = _text(d / f"in{k}_label") or _text(d / f"curr{k}_label") or f"channel{k}"
                if label.upper() == "NC":  # INA3221 channels that are not connected
                    continue
                if _readable([v, c], skipped, f"hwmon:{chip}:{label}"):
                    # millivolts x milliamps = microwatts
                    found.append((label, Rail(f"hwmon:{chip}:{label}", POWER, (v, c), 1e-6)))
        board = [r for label, r in found if _BOARD_INPUT.search(label)]
        rails.extend(board or [r for _, r in found])
    return rails


def _battery(root: Path, skipped: list[str]) -> list[Rail]:
    d = root / "sys/class/power_supply/battery"
    cur, volt = d / "current_now", d / "voltage_now"
    if not (cur.exists() and volt.exists()):
        return []
    status = _text(d / "status")
    if status in ("Charging", "Full"):
        skipped.append(f"battery: {status.lower()}; unplug the charger to measure")
        return []
    if not _readable([volt, cur], skipped, "battery"):
        return []
    # microvolts x microamps = picowatts
    return [Rail("battery", POWER, (volt, cur), 1e-12)]


def find_rails(root: str | Path = "/") -> Rails:
    """The rails under ``root`` (see the module docstring for which are used)."""
    root = Path(root)
    skipped: list[str] = []
    for source, finder in (("rapl", _rapl), ("hwmon", _hwmon), ("battery", _battery)):
        rails = finder(root, skipped)
        if rails:
            return Rails(source, tuple(rails), tuple(skipped))
    return Rails("", (), tuple(skipped))


class PowerSampler:
    """Reads rails in a background thread (or when told) and averages power over time windows.

    Use as a context manager; call :meth:`mark` at the edges of a window so counters are read
    exactly there. ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        rails: Rails,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.rails = rails
        # Counters only need reading often enough not to miss a wrap; readings need a denser grid.
        self.interval_s = interval_s or (
            0.05 if any(r.kind == POWER for r in rails.rails) else 0.25
        )
        self.clock = clock
        self._samples: list[list[tuple[float, float]]] = [[] for _ in rails.rails]
        self._offset = [0.0 for _ in rails.rails]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def mark(self) -> float:
        """Read every rail now; returns the time of the reading."""
        with self._lock:
            t = self.clock()
            for i, rail in enumerate(self.rails.rails):
                try:
                    value = rail.read()
                except (OSError, ValueError) as e:
                    self.errors.append(f"{rail.name}: {e}")
                    continue
                series = self._samples[i]
                if rail.kind == ENERGY:
                    if series and value + self._offset[i] < series[-1][1]:
                        # the counter wrapped since the last reading
                        self._offset[i] += (
                            rail.wrap * rail.scale if rail.wrap else series[-1][1] - value
                        )
                    value += self._offset[i]
                series.append((t, value))
            return t

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.mark()

    def __enter__(self) -> PowerSampler:
        self.mark()
        if self.rails:
            self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.mark()

    def mean_power_w(self, t0: float, t1: float) -> float | None:
        """Average total power over ``[t0, t1]``, or None when a rail has no reading in reach."""
        if t1 <= t0 or not self.rails:
            return None
        total = 0.0
        with self._lock:
            for rail, series in zip(self.rails.rails, self._samples):
                if not series:
                    return None
                if rail.kind == ENERGY:
                    if len(series) < 2:
                        return None
                    total += (_interp(series, t1) - _interp(series, t0)) / (t1 - t0)
                else:
                    total += _integral(series, t0, t1) / (t1 - t0)
        return total


def _interp(series: list[tuple[float, float]], t: float) -> float:
    """Piecewise-linear value at ``t``; beyond the ends, extrapolated along the nearest segment."""
    if len(series) == 1:
        return series[0][1]
    i = 1
    while i < len(series) - 1 and series[i][0] < t:
        i += 1
    (ta, va), (tb, vb) = series[i - 1], series[i]
    return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)


def _integral(series: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Integral over ``[t0, t1]`` of the readings, linear between them, constant beyond the ends."""

    def at(t: float) -> float:
        if t <= series[0][0]:
            return series[0][1]
        if t >= series[-1][0]:
            return series[-1][1]
        return _interp(series, t)

    points = [t0, *(t for t, _ in series if t0 < t < t1), t1]
    return sum((b - a) * (at(a) + at(b)) / 2 for a, b in zip(points, points[1:]))

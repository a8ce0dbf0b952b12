"""Number formats, one rule each, used by every page, chart and export.

- Ratios (speedups): 3 decimals between 0.1 and 10 (1.316×, 0.735×: an end-to-end gain of 0.3%
  must be visible), 1 decimal from 10 (12.3×), none from 100 (150×), and below 0.1 three
  significant digits written out (0.0123×, 0.000633×): never an exponent, never "0.00×".
- Times: microseconds with a unit that fits (208 µs, 21.5 ms, 1.23 s), three significant digits.
  Whether a time is per call or per forward pass is said by the label, never left implicit.
- Errors (the verifier's worst error): always scientific with three significant digits
  (9.54e-07, 1.91e-06), so two of them read side by side.
- Shares: one decimal percent (12.3%).

Plain functions from float (or None / NaN) to str; "—" for a missing value.
"""
from __future__ import annotations

import math
import re

MISSING = "—"


def _missing(v) -> bool:
    try:
        return v is None or not math.isfinite(float(v))
    except (TypeError, ValueError):
        return True


def ratio(v) -> str:
    """A speedup (x times the baseline's speed) as text, e.g. 1.316×, 0.000633×."""
    if _missing(v):
        return MISSING
    v = float(v)
    if v <= 0:
        return f"{v:g}×"
    if 0.1 <= v < 10:
        return f"{v:.3f}×"
    if 10 <= v < 100:
        return f"{v:.1f}×"
    if v >= 100:
        return f"{v:,.0f}×"
    digits = 2 - math.floor(math.log10(v))  # three significant digits, written out
    return f"{v:.{digits}f}×"


def us(v) -> str:
    """A time in microseconds with a unit that fits: 9.87 µs, 208 µs, 21.5 ms, 1.23 s."""
    if _missing(v):
        return MISSING
    v = float(v)
    for scale, unit in ((1e6, "s"), (1e3, "ms"), (1.0, "µs")):
        if abs(v) >= scale or unit == "µs":
            x = v / scale
            if abs(x) >= 100:
                return f"{x:,.0f} {unit}"
            return f"{x:.1f} {unit}" if abs(x) >= 10 else f"{x:.2f} {unit}"
    return MISSING  # unreachable: the last unit always matches


def error(v) -> str:
    """A numerical error (max |a - b| / scale) in scientific notation: 9.54e-07."""
    if _missing(v):
        return MISSING
    return "0" if float(v) == 0 else f"{float(v):.2e}"


def share(v) -> str:
    """A fraction as a percent: 0.123 -> 12.3%."""
    return MISSING if _missing(v) else f"{100 * float(v):.1f}%"


def pct(v) -> str:
    """A value already in percent: 12.34 -> 12.3%."""
    return MISSING if _missing(v) else f"{float(v):.1f}%"


def duration(seconds) -> str:
    """Wall time: 45s, 3m 07s, 4h 31m 02s."""
    if _missing(seconds):
        return MISSING
    seconds = int(round(float(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


# st.column_config formats (printf, as the data grid applies them) that follow the rules above
# as closely as a single format can: numeric columns stay sortable.
RATIO_COL = "%.3f×"
SMALL_RATIO_COL = "%.3g×"     # a column with values under 0.1 (interpreter runs)
TIME_COL = "%.1f"
ERROR_COL = "%.2e"
PCT_COL = "%.1f%%"


def ratio_column_format(values) -> str:
    """The column format for a column of speedups: 3 decimals, unless some are under 0.1, where
    3 decimals would print 0.000 (an interpreter run's 0.000633×)."""
    vals = [float(v) for v in values if not _missing(v)]
    return SMALL_RATIO_COL if vals and min(vals) < 0.1 else RATIO_COL


_CHAIN = re.compile(r"\s*\((?:[\w.]+(?:Error|Exception|Exit|Interrupt))\b:?(?P<rest>.*)\)\s*$",
                    re.S)
_ERRNO = re.compile(r"\[Errno -?\d+\][^\n;()]*")
_PREFIX = re.compile(r"^(?:[\w.]+\.)?(?:[A-Z]\w*(?:Error|Exception)):\s*")


def message(text, limit: int = 300) -> str:
    """An error as a person reads it: one line, no exception class chain ("(APIConnectionError:
    litellm.APIConnectionError: OllamaException - ...)" becomes the OS's own words, e.g.
    "([Errno 111] Connection refused)"), no leading "ValueError:", at most ``limit`` characters.
    What it says is kept; only the plumbing goes."""
    text = " ".join(str(text or "").split())
    m = _CHAIN.search(text)
    if m:
        errno = _ERRNO.search(m["rest"])
        text = text[:m.start()] + (f" ({errno.group(0).strip()})" if errno else "")
    while _PREFIX.match(text):
        text = _PREFIX.sub("", text, count=1)
    if not text:
        return "failed"
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""Skip reasons summed up: one line per reason with a count and the first few names, so that
a run over hundreds of series prints a few lines instead of one per series (each series'
own reason stays in results.json "skipped" and in `python launch.py --mode data`).

The rule that groups reasons: a reason's head is its text before the first ": ", "; " or
" (" (what follows is detail: a month list, a file's error, counts' parts), with the
series' own name and symbol written as "<series>"; heads that differ only in their numbers
group together, and the group's label shows a word only where every member agrees on it
(the whole reason when every member has the very same one).
"""

from __future__ import annotations

import re

SHOWN_NAMES = 3  # names printed per group before "and N more"
_DETAIL = re.compile(r": |; | \(")
_NUMBER = re.compile(r"\d+")


def reason_head(name: str, reason: str) -> str:
    """The stable part of `reason`, the series `name` ("SYMBOL-INTERVAL") masked out."""
    head = _DETAIL.split(reason, maxsplit=1)[0].strip()
    head = head.replace(name, "<series>").replace(name.rsplit("-", 1)[0], "<series>")
    return head or reason


def _label(heads: list[str]) -> str:
    """The words every head agrees on, the others as "N" (heads of one group have the same
    words once numbers are masked, so they line up word by word)."""
    words = [h.split(" ") for h in heads]
    return " ".join(
        w[0] if len(set(w)) == 1 else _NUMBER.sub("N", w[0]) for w in zip(*words, strict=True)
    )


def grouped(pairs) -> list[tuple[str, list[str]]]:
    """(label, sorted names) per reason group of `pairs` ((name, reason) ...), the largest
    group first."""
    groups: dict[str, list[tuple[str, str, str]]] = {}
    for name, reason in pairs:
        head = reason_head(name, reason)
        groups.setdefault(_NUMBER.sub("N", head), []).append((name, head, reason))
    out = []
    for members in groups.values():
        reasons = {r for _, _, r in members}  # one shared reason is shown whole
        label = reasons.pop() if len(reasons) == 1 else _label([h for _, h, _ in members])
        out.append((label, sorted(n for n, _, _ in members)))
    return sorted(out, key=lambda g: (-len(g[1]), g[0]))


def names_text(names: list[str]) -> str:
    """'A, B, C and 37 more', or all names when there are at most SHOWN_NAMES + 1."""
    if len(names) <= SHOWN_NAMES + 1:
        return ", ".join(names)
    return f"{', '.join(names[:SHOWN_NAMES])} and {len(names) - SHOWN_NAMES} more"


def lines(verb: str, pairs) -> list[str]:
    """One line per reason group: '<verb> 40 series: <reason> (A, B, C and 37 more)'."""
    return [
        f"{verb} {len(names)} series: {label} ({names_text(names)})"
        for label, names in grouped(pairs)
    ]

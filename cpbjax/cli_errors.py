"""One-line command-line errors (exit 2) for config flags, shared by the entry points.

`python -m cpbjax.data` uses these; they say what launch.py's `_parse_flags` and
`_load_error` say, so a bad --config gives one line wherever it is given.
"""

from __future__ import annotations

import re
import sys

from absl import flags


def fail(message: str) -> None:
    """Prints `error: message` to stderr and exits 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_flags(argv):
    """absl parsing, but an unknown config key or a failing config file is one line, exit 2."""
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        # ml_collections reports only the last path component, e.g. "'lr_typo'".
        key = re.findall(r"'([^']+)'", str(e))
        given = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
        fail(f"unknown config key {key[-1] if key else e!s} (given: {given})")
    except (TypeError, ValueError, flags.Error) as e:
        # A config file that fails to load puts its whole traceback in the message.
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        where = lines[0].split(": ")[0] if len(lines) > 1 else ""
        reason = re.sub(r"^[\w.]+(Error|Exception): ", "", lines[-1]) if lines else repr(e)
        fail(f"{where + ': ' if where else ''}{reason}")


def load_error(e: BaseException) -> str:
    """One line from a config file that failed to load: the last line of its message."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return "cannot load --config: " + (lines[-1] if lines else type(e).__name__)

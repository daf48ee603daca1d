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
    """absl parsing, but an unknown config key, a failing config file or a list-valued
    config key given twice is one line, exit 2."""
    try:
        rest = flags.FLAGS(argv)
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
    _refuse_repeated_sequences(argv)
    return rest


def _repeated_config_keys(argv) -> list[str]:
    """The keys of --config.<key> overrides that argv gives more than once."""
    seen, repeated = set(), []
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        key = arg[len("--config.") :].split("=", 1)[0]
        if key in seen and key not in repeated:
            repeated.append(key)
        seen.add(key)
    return repeated


def _refuse_repeated_sequences(argv) -> None:
    """Exits 2 where a tuple-valued config key is given twice: ml_collections joins the
    two tuples (symbols=('BTCUSDT',) twice with ETHUSDT gives both) where a user expects
    the second to replace the first. A scalar given twice keeps absl's rule: the last wins."""
    repeated = _repeated_config_keys(argv)
    if not repeated:
        return
    try:
        config = flags.FLAGS["config"].value
    except (OSError, ValueError):  # a config file that fails to load: main says so
        return
    for key in repeated:
        value = config
        for part in key.split("."):
            value = getattr(value, part, None)
        if isinstance(value, (tuple, list)):
            fail(
                f"--config.{key} is given more than once; a tuple given twice is joined, not "
                "replaced: give it once with every value, e.g. "
                f"--config.{key}=\"('A', 'B')\""
            )


def load_error(e: BaseException) -> str:
    """One line from a config file that failed to load: the last line of its message."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return "cannot load --config: " + (lines[-1] if lines else type(e).__name__)

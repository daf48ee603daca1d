"""One-line command-line errors (exit 2) for config flags, shared by the entry points.

`python -m cpbjax.data` uses these; they say what launch.py's `_parse_flags` and
`_load_error` say, so a bad --config gives one line wherever it is given.
"""

from __future__ import annotations

import errno
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
        fail(unknown_key(e, argv))
    except (TypeError, ValueError, flags.Error) as e:
        if isinstance(e, TypeError) and "indices must be integers" in str(e):
            # ml_collections indexes a tuple value with the key after it (data.symbols.x).
            fail(f"a config key goes inside a tuple value, which has no keys: {_overrides(argv)}")
        fail(_parse_failure(e))
    _refuse_repeated_sequences(argv)
    return rest


def _parse_failure(e: BaseException) -> str:
    """One line from a flag absl refused or a config file that failed to load (its
    message holds the file's whole traceback): where, and the last line's reason."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    where = lines[0].split(": ")[0] if len(lines) > 1 else ""
    reason = re.sub(r"^[\w.]+(Error|Exception): ", "", lines[-1]) if lines else repr(e)
    return f"{where + ': ' if where else ''}{reason}"


def refuse_extra_arguments(rest, modes=()) -> None:
    """Exits 2 naming the positional arguments absl left in `rest` (its argv[1:]): a
    program that takes none would otherwise drop them unread, so `launch.py --config C
    predict` would train. One that names a mode in `modes` is shown its --mode spelling."""
    extra = list(rest[1:])
    if not extra:
        return
    named = ", ".join(repr(a) for a in extra)
    mode = next((a for a in extra if a in modes), None)
    hint = f" (did you mean --mode {mode}?)" if mode else ""
    fail(f"unexpected argument{'s' if len(extra) > 1 else ''} {named}{hint}")


def _overrides(argv) -> str:
    """The --config.<key> overrides that argv gives, without their values."""
    return ", ".join(a.split("=")[0] for a in argv[1:] if a.startswith("--config."))


def unknown_key(e: BaseException, argv) -> str:
    """One line for a --config.<key> that the config does not have: the bad name, the
    override it is in and ml_collections' suggestion. Its KeyError names only the last
    path component and puts the suggestion on a second line ("'trian'\\nDid you mean
    "train" instead of "trian"?"), which str(KeyError) would print as a literal \\n."""
    while e.args and isinstance(e.args[0], BaseException):  # AttributeError(KeyError(...))
        e = e.args[0]
    text = str(e.args[0]) if e.args else str(e)
    lookup = re.search(r"Attempting to lookup: (\S+)", text)  # a key below a plain value
    names = re.findall(r"'([^']+)'", text.splitlines()[0] if text else "")
    bad = lookup.group(1).split(".")[-1] if lookup else (names[-1] if names else text)
    given = [
        a.split("=")[0]
        for a in argv[1:]
        if a.startswith("--config.") and bad in a.split("=")[0].split(".")
    ]
    where = f" in {given[0]}" if given else f" (given: {_overrides(argv)})"
    hint = re.search(r'Did you mean "([^"]+)"', text)
    if hint:
        return f"unknown config key {bad}{where} (did you mean {hint.group(1)}?)"
    if lookup:
        return f"unknown config key {bad}{where}: {lookup.group(1).rsplit('.', 1)[0]} has no keys"
    return f"unknown config key {bad}{where}"


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


# How TensorStore (under Orbax) says a write hit a full disk: the text of a ValueError
# (RESOURCE_EXHAUSTED), the file in the "Failed writing" clause before it.
_TENSORSTORE_ENOSPC = f"[os_error_code='{errno.ENOSPC}']"
_TENSORSTORE_FILE = re.compile(r'Failed writing: "([^"]+)"')


def disk_full(error: BaseException, workdir: str) -> str | None:
    """One line for a write that failed with "no space left on device" (errno ENOSPC,
    also when Orbax wraps it or it is the cause of another error), naming the file being
    written (else the workdir), or None for any other error."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return f"cannot write {error.filename or f'to {workdir}'}: no space left on device"
        text = str(error)
        if _TENSORSTORE_ENOSPC in text:
            found = _TENSORSTORE_FILE.search(text)
            where = found.group(1) if found else f"to {workdir}"
            return f"cannot write {where}: no space left on device"
        error = error.__cause__ or error.__context__
    return None

"""`python -m cpbjax.data` is `python launch.py --mode data` now (cpbjax/modes/data_table.py):
the data package holds no entry point, so that nothing in it imports the config above it."""

import sys

if __name__ == "__main__":
    print(
        "error: the data table is `python launch.py --mode data --config <configs/x.py> ...` "
        "(the same flags as before)",
        file=sys.stderr,
    )
    sys.exit(2)

"""What a shorter patience would have kept, read from one LSTM run's metrics.jsonl.

Whether an epoch improves a series (`improved`: its val loss beats the best by
train.min_delta standard errors) depends only on the epochs before it, never on the
patience. So a run with a shorter patience and the same epoch cap follows the long run's
history exactly up to its own stop. That gives its stop epoch and the best val loss it
would keep. The cap cannot be read off this way: train.epochs sets the length of the
warmup and of the cosine schedule, so another cap gives another run.

  python experiments/lstm_epochs/stopping.py runs/lstm-cap/metrics.jsonl
  python experiments/lstm_epochs/stopping.py runs/lstm-long/metrics.jsonl --patience 200

Prints, per patience: the epochs the run would last (its slowest series), the
coin-epochs it would train, how many series would keep a worse val loss than the long
run, and the median and worst relative val-loss change.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

PATIENCES = (1, 2, 3, 5, 10, 20, 30, 50, 100)  # read off a run whose own patience is longer


def histories(path: str) -> dict[str, list[tuple[bool, float]]]:
    """series -> [(improved, best val loss)] per epoch it trained, in epoch order. A
    record's `active` is after that epoch's stop decision, so a series trained in an
    epoch when it was active after the one before."""
    out: dict[str, list[tuple[bool, float]]] = {}
    active_before: dict[str, bool] = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            columns = zip(
                record["series"],
                record["active"],
                record["improved"],
                record["best_val_loss"],
                strict=True,
            )
            for name, active, improved, best in columns:
                if active_before.get(name, True):
                    out.setdefault(name, []).append((bool(improved), float(best)))
                active_before[name] = active
    return out


def stop(history: list[tuple[bool, float]], patience: int) -> tuple[int, float, bool]:
    """(the epoch a run with `patience` stops this series at, the val loss it keeps,
    whether the patience stopped it rather than the history's end)."""
    last_improved = 0
    for epoch, (improved, best) in enumerate(history, start=1):
        last_improved = epoch if improved else last_improved
        if epoch - last_improved >= patience:
            return epoch, best, True
    return len(history), history[-1][1], False


def main(path: str, long_patience: int, epoch_cap: int) -> None:
    """Prints the table for the run at `path`, which ran with train.patience =
    long_patience and train.epochs = epoch_cap."""
    runs = histories(path)
    full = {name: stop(h, long_patience) for name, h in runs.items()}
    # The rule read back must stop each series where the long run itself stopped it (a
    # series that ran to the cap stops there instead).
    differ = [n for n, h in runs.items() if not (full[n][2] or len(h) == epoch_cap)]
    if differ:
        sys.exit(f"the simulated stops differ from the run's for {differ}: check the rule")
    improved = {n: [e for e, (i, _) in enumerate(h, start=1) if i] for n, h in runs.items()}
    print(f"{len(runs)} series; epochs that improved each: {improved}")
    print("| patience | run epochs | coin-epochs | worse | median change | worst change |")
    print("|---|---|---|---|---|---|")
    for patience in [p for p in PATIENCES if p < long_patience] + [long_patience]:
        got = {name: stop(h, patience)[:2] for name, h in runs.items()}
        change = [got[n][1] / full[n][1] - 1 for n in runs]
        print(
            f"| {patience} | {max(e for e, _ in got.values())} | "
            f"{sum(e for e, _ in got.values())} | {sum(c > 0 for c in change)} of {len(runs)} | "
            f"{statistics.median(change):+.4%} | {max(change):+.4%} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="the long run's metrics.jsonl")
    parser.add_argument("--patience", type=int, default=20, help="its train.patience")
    parser.add_argument("--epochs", type=int, default=200, help="its train.epochs")
    args = parser.parse_args()
    main(args.metrics, args.patience, args.epochs)

"""Training: the compiled epoch of a group of coins (step, pooled, batching, validation,
early_stopping, losses, optimizer), the group program that runs it (group, streaming,
compaction, memory), and what survives a kill (checkpoint, ledger)."""

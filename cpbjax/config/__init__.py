"""The run config: its schema and variants (schema), the checks of every field and of the
rules between fields (check, rules), its upgrade from older releases (history), a sweep's
grid of settings (sweep_grid) and the command line's one-line errors (cli_errors).

Nothing is imported here, so that data and models can import `cpbjax.config.rules` (the
leaf that every field check uses) without loading the schema above them.
"""

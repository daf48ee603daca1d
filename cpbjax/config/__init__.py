"""The run config: its schema and variants (schema), the checks of every field and of the
rules between them (check; the value rules themselves are the leaf cpbjax/config_rules.py,
which data and models use too), its upgrade from older releases (history), a sweep's grid
of settings (sweep_grid) and the command line's one-line errors (cli_errors)."""

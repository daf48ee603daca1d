"""What a run shows: the report (run_report, tables, html_page, sweep_section, plots,
plot_workers), an export's model card, and the run log (runlog, tensorboard)."""

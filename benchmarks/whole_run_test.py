"""benchmarks/whole_run.py's figures, medians and table on made-up timings (no run)."""

import pytest

from benchmarks import whole_run


def _timings(stages: dict, epoch_s: float = 2.0) -> dict:
    compiles = [
        {"program": "jit(run_epoch)", "seconds": epoch_s},
        {"program": "jit(f)", "seconds": 0.5},
    ]
    return {"stages": stages, "wall_seconds": sum(stages.values()), "compiles": compiles}


def test_figures_put_the_process_wall_outside_the_clock_in_untimed():
    stages = {"startup": 3.0, "load": 1.0, "compile": 2.5, "train": 4.0, "other": 0.25}
    got = whole_run.figures(_timings(stages), wall=11.0, peak_gib=1.5)
    assert got["untimed"] == 11.0 - 10.75
    assert got["report"] == 0.0  # a stage the run did not enter
    assert sum(got[s] for s in whole_run.STAGES) == got["wall"] == 11.0
    assert (got["programs"], got["xla s"], got["epoch programs"], got["epoch xla s"]) == (
        2,
        2.5,
        1,
        2.0,
    )
    assert got["peak GiB"] == 1.5
    assert got["all but train"] == 11.0 - 4.0


def _run(wall: float, train: float, programs: int) -> dict:
    stages = {"startup": 1.0, "train": train, "other": wall - 1.0 - train - 0.5}
    return whole_run.figures(_timings(stages, epoch_s=programs), wall, peak_gib=2.0)


def test_median_row_shows_each_figure_s_median_and_each_stage_s_share_of_the_median_wall():
    runs = [_run(10.0, 5.0, 1), _run(30.0, 6.0, 3), _run(20.0, 10.0, 2)]
    row = whole_run.median_row("mlp", "warm", runs)
    assert (row["model"], row["cache"], row["runs"], row["wall"]) == ("mlp", "warm", 3, 20.0)
    assert row["train"] == "6.0 (30%)"  # median 6 s of the median 20 s wall
    assert row["startup"] == "1.0 (5%)" and row["untimed"] == "0.5 (2%)"
    assert row["load"] == "0.0 (0%)"
    assert row["epoch xla s"] == 2.0 and row["peak GiB"] == 2.0


def test_table_has_a_row_per_model_and_cache_and_a_column_per_stage():
    runs = {("mlp", "cold"): [_run(10.0, 5.0, 1)], ("mlp", "warm"): [_run(8.0, 5.0, 1)]}
    lines = whole_run.table(runs).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["model", "cache", "runs", "wall", *whole_run.STAGES, *whole_run.FIGURES]
    rows = [line for line in lines[2:] if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    assert [(c[0], c[1], c[3]) for c in cells] == [("mlp", "cold", "10"), ("mlp", "warm", "8")]
    assert cells[1][header.index("train")] == "5.0 (62%)"
    assert lines[-1] == "mlp: all but training, warm / cold = 3.0 / 5.0 s = 60%"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "0"], "--repeats 0 must be at least 1"),
        (["--models", "mlp,rnn"], "configs/rnn.py"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        whole_run._args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_variant_is_demo_unless_a_mirror_is_given():
    assert whole_run._args(["--models", "mlp"]).variant == "demo"
    assert whole_run._args(["--base-url", "/mirror"]).variant == ""
    assert whole_run._args(["--base-url", "/mirror", "--variant", "tiny"]).variant == "tiny"

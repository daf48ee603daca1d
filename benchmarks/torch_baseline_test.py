"""Tests for benchmarks/torch_baseline.py (skipped without torch) and benchmarks/common.py."""

import os
import stat

import numpy as np
import pytest

from benchmarks import common

L, H = 30, 10


@pytest.fixture(scope="module")
def tb():
    """The baseline module; the tests that use it skip when torch is not installed."""
    torch = pytest.importorskip("torch")
    from benchmarks import torch_baseline  # noqa: PLC0415 (needs torch)

    # One thread: on the shared CI cores, torch's spinning OpenMP workers slow down 10x.
    torch.set_num_threads(1)

    return torch_baseline


# ---------------------------------------------------------------- benchmarks/common.py


def test_median_time_reports_the_median_of_every_call(monkeypatch):
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 25.0])  # Calls take 3, 1 and 5 seconds.
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(ticks))
    calls = []
    median, times = common.median_time(lambda: calls.append(1), repeats=3)
    assert (median, times, len(calls)) == (3.0, [3.0, 1.0, 5.0], 3)
    with pytest.raises(ValueError, match="repeats=0"):
        common.median_time(lambda: None, repeats=0)


def test_markdown_table_formats_floats_and_missing_cells():
    rows = [{"model": "gru", "s": 1.234567, "n": 3}, {"model": "a|b", "s": None}]
    expected = "| model | s | n |\n|---|---|---|\n| gru | 1.235 | 3 |\n| a\\|b |  |  |\n"
    assert common.markdown_table(rows, ["model", "s", "n"]) == expected


def test_machine_facts_names_cores_and_installed_versions():
    facts = common.machine_facts()
    assert facts["cores"] == os.cpu_count()
    assert facts["numpy"] == np.__version__
    assert facts["cpu"] and facts["date"].endswith("UTC")


def test_print_and_record_quotes_the_command_and_writes_nothing_when_told(tmp_path, capsys):
    facts = {"date": "2026-01-02 03:04 UTC", "cpu": "Test CPU", "cores": 2}
    argv = ["--flags=--config.data.symbols=('A','B')", "--n", "3"]
    assert common.command_line("x_bench", argv) == (
        "python benchmarks/x_bench.py '--flags=--config.data.symbols=('\"'\"'A'\"'\"','\"'\"'B'\"'\"')' --n 3"
    )
    path = common.print_and_record(str(tmp_path), "x_bench", "T", "| a |\n", argv, facts)
    with open(path) as f:
        text = f.read()
    assert f"Command: `{common.command_line('x_bench', argv)}`" in text
    assert capsys.readouterr().out == f"| a |\n\nRecord: {path}\n"
    assert common.print_and_record("", "x_bench", "T", "| b |\n", argv, facts) is None
    assert capsys.readouterr().out == "| b |\n\n" and len(os.listdir(tmp_path)) == 1


def test_write_record_writes_a_new_dated_file_per_run(tmp_path):
    records = tmp_path / "records"
    facts = {"date": "2026-01-02 03:04 UTC", "cpu": "Test CPU", "cores": 2}
    table = common.markdown_table([{"a": 1}], ["a"])
    first = common.write_record(str(records), "x_bench", "Title", "python x.py --y", table, facts)
    expected = (
        "# Title (2026-01-02 03:04 UTC)\n\n"
        "Machine: cpu Test CPU, cores 2.\n\nCommand: `python x.py --y`\n\n| a |\n|---|\n| 1 |\n"
    )
    assert first == str(records / "x_bench-20260102T0304Z.md")
    assert (records / "x_bench-20260102T0304Z.md").read_text() == expected
    # A second run in the same minute gets its own file; the first is left as it was.
    second = common.write_record(str(records), "x_bench", "Other", "python x.py", table, facts)
    assert second == str(records / "x_bench-20260102T0304Z-2.md")
    assert (records / "x_bench-20260102T0304Z.md").read_text() == expected
    assert sorted(p.name for p in records.iterdir()) == [
        "x_bench-20260102T0304Z-2.md",
        "x_bench-20260102T0304Z.md",
    ]  # No temp file left.
    mode = stat.S_IMODE(os.stat(first).st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


def test_records_dir_is_benchmarks_records():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    expected = os.path.join(repo, "benchmarks", "records")
    assert expected == common.RECORDS_DIR


# ---------------------------------------------------------------- the old models


def _cpbjax_param_count(tb, name: str, decoding: str) -> int:
    """Parameters of cpbjax's model at the default config (shapes only, nothing computed)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from cpbjax import models  # noqa: PLC0415

    config = tb.default_config(name)
    config.model.decoding, config.model.baseline = decoding, "none"
    module = models.build(models.make_config(config))
    x_BLF = jnp.zeros((2, L, 4))
    shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), x_BLF))
    return sum(np.prod(p.shape, dtype=int) for p in jax.tree_util.tree_leaves(shapes["params"]))


@pytest.mark.parametrize("decoding", ["autoregressive", "direct"])
@pytest.mark.parametrize("name", ["transformer", "gru", "lstm"])
def test_parameter_counts_equal_cpbjax(tb, name, decoding):
    model = tb.build_model(name, H, decoding)
    expected = _cpbjax_param_count(tb, name, decoding)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert tb.EXPECTED_PARAMS[name, decoding] == expected


def test_unknown_model_or_decoding_is_named(tb):
    with pytest.raises(ValueError, match="'cnn'"):
        tb.build_model("cnn")
    with pytest.raises(ValueError, match="'beam'"):
        tb.build_model("gru", H, "beam")


def _batch(torch, seed=0, batch=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, L, 4, generator=g) * 0.01, torch.randn(
        batch, H, 4, generator=g
    ) * 0.01


def test_transformer_reruns_unmasked_decoder_over_growing_sequence(tb, monkeypatch):
    torch = pytest.importorskip("torch")
    model = tb.build_model("transformer", H).eval()
    calls = []
    model.decoder.register_forward_hook(
        lambda m, args, kwargs, out: calls.append((args[0].shape[1], kwargs.get("tgt_mask"))),
        with_kwargs=True,
    )
    draws = []
    monkeypatch.setattr(tb.random, "random", lambda: draws.append(1) or 0.7)
    x, y = _batch(torch)
    assert model(x, y, 0.5).shape == (3, H, 4)
    assert calls == [(t, None) for t in range(1, H + 1)]  # H calls of length 1..H: O(H^2).
    assert len(draws) == H - 1  # One host draw per step that feeds a next input.


@pytest.mark.parametrize("name, draws_per_batch", [("transformer", H - 1), ("gru", 1), ("lstm", 1)])
def test_teacher_forcing_follows_the_host_random_number(tb, monkeypatch, name, draws_per_batch):
    torch = pytest.importorskip("torch")
    model = tb.build_model(name, H).eval()  # eval: no dropout, so outputs are comparable.
    x, y1 = _batch(torch, seed=1)
    y2 = y1 + 1.0
    draws = []
    with torch.no_grad():
        for value in (0.0, 0.99):  # Below 0.5 feeds the true candle, above feeds the forecast.
            monkeypatch.setattr(tb.random, "random", lambda v=value: draws.append(v) or v)
            same = torch.equal(model(x, y1, 0.5), model(x, y2, 0.5))
            assert same == (value > 0.5)
    assert len(draws) == 4 * draws_per_batch


@pytest.mark.parametrize("name", ["transformer", "gru", "lstm"])
def test_direct_decoding_is_one_pass_without_host_draws_or_targets(tb, monkeypatch, name):
    torch = pytest.importorskip("torch")
    draws, calls = [], []
    monkeypatch.setattr(tb.random, "random", lambda: draws.append(1) or 0.0)
    model = tb.build_model(name, H, "direct").eval()
    if name == "transformer":  # The decoder runs once, over all H learned queries.
        model.decoder.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[1]))
    x, y = _batch(torch, seed=2)
    with torch.no_grad():  # Teacher forcing 1.0 would feed y under autoregressive.
        out1, out2 = model(x, y, 1.0), model(x, y + 1.0, 1.0)
    assert out1.shape == (3, H, 4) and torch.equal(out1, out2)
    assert calls == ([H, H] if name == "transformer" else [])
    assert draws == []


@pytest.mark.parametrize("name", ["transformer", "gru", "lstm"])
def test_direct_epoch_updates_every_parameter(tb, name):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cfg = tb.default_config(name).train
    model = tb.build_model(name, H, "direct")
    start = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(torch, batch=cfg.batch_size + 6)  # A full batch and a partial one.
    loss = tb.train_epoch(model, tb.make_optimizer(model, cfg), x, y, cfg)
    assert np.isfinite(loss)
    assert all(not torch.equal(a, b) for a, b in zip(start, model.parameters(), strict=True))


@pytest.mark.parametrize("decoding", ["autoregressive", "direct"])
@pytest.mark.parametrize("name", ["transformer", "gru", "lstm"])
def test_one_epoch_per_series_trains_with_finite_loss(tb, name, decoding):
    series_windows = tb.benchmark_windows(name, n_series=2, n_candles=160)
    result = tb.time_torch_epochs(name, series_windows, 1, threads=1, decoding=decoding)
    assert (result["model"], result["decoding"], result["series"]) == (name, decoding, 2)
    assert result["params"] == sum(
        p.numel() for p in tb.build_model(name, H, decoding).parameters()
    )
    assert len(result["epoch_s"]) == 2 and result["seconds_per_model_epoch"] > 0
    assert np.isfinite(result["train_loss"]) and np.isfinite(result["val_loss"])
    assert result["seconds_per_model_epoch"] == result["epoch_s"][1]  # First is warm-up.


def test_train_epoch_updates_every_parameter(tb):
    torch = pytest.importorskip("torch")
    cfg = tb.default_config("gru").train
    model = tb.build_model("gru", H)
    start = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(torch, batch=70)  # 64 + a last partial batch of 6.
    loss = tb.train_epoch(model, tb.make_optimizer(model, cfg), x, y, cfg)
    assert np.isfinite(loss)
    assert all(not torch.equal(a, b) for a, b in zip(start, model.parameters(), strict=True))


@pytest.mark.parametrize(
    "name, opt, wd, batch",
    [("transformer", "AdamW", 1e-2, 128), ("gru", "Adam", 0.0, 64), ("lstm", "Adam", 1e-5, 32)],
)
def test_optimiser_and_batch_follow_cpbjax_defaults(tb, name, opt, wd, batch):
    cfg = tb.default_config(name).train
    optimiser = tb.make_optimizer(tb.build_model(name), cfg)
    group = optimiser.param_groups[0]
    assert (type(optimiser).__name__, group["lr"], group["weight_decay"]) == (opt, 1e-3, wd)
    assert (cfg.batch_size, cfg.grad_clip) == (batch, 1.0)


def test_fewer_than_two_model_epochs_is_an_error(tb):
    windows = tb.benchmark_windows("gru", n_series=1, n_candles=160)
    with pytest.raises(ValueError, match="1 series x 1 epochs"):
        tb.time_torch_epochs("gru", windows, epochs=1)


# ---------------------------------------------------------------- same numbers as cpbjax


def test_series_are_cpbjax_synthetic_source_in_config_order(tb):
    windows = tb.benchmark_windows("lstm", n_series=3, n_candles=160)
    assert [w["name"] for w in windows] == ["BTCUSDT-15m", "BTCUSDT-1h", "ETHUSDT-15m"]
    assert windows[0]["train"][0].shape[1:] == (L, 4)


def test_windows_equal_cpbjax_gather_and_a_plain_reference(tb):
    import jax.numpy as jnp  # noqa: PLC0415

    from cpbjax.data import stacking, synthetic, windows  # noqa: PLC0415

    data_cfg = tb.default_config("gru").data
    data_cfg.max_candles = data_cfg.min_candles = 300
    series = synthetic.generate("ETHUSDT", "1h", 300)
    prep = windows.prepare_series(series, data_cfg)
    (x_t, y_t), ends = tb.prepare_windows([series], data_cfg)[0]["train"], prep.ends["train"]
    source = stacking.WindowSource(*map(jnp.asarray, stacking.window_source(prep)))
    x_j, y_j = stacking.gather(source, jnp.asarray(ends), L, H)
    np.testing.assert_allclose(x_t.numpy(), np.asarray(x_j), atol=2e-6)
    np.testing.assert_allclose(y_t.numpy(), np.asarray(y_j), atol=2e-6)
    ohlc = series.ohlcv[:, :4]
    for i in range(0, len(ends), max(len(ends) // 5, 1)):
        t = ends[i]
        close = ohlc[t, 3]
        np.testing.assert_allclose(
            x_t[i].numpy(), np.log(ohlc[t - L + 1 : t + 1] / close), atol=1e-6
        )
        np.testing.assert_allclose(
            y_t[i].numpy(), np.log(ohlc[t + 1 : t + H + 1] / close), atol=1e-6
        )


# ---------------------------------------------------------------- benchmarks/train_bench.py


@pytest.fixture()
def train_bench(monkeypatch):
    """benchmarks/train_bench, imported without its XLA_FLAGS default (jax is set up)."""
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    from benchmarks import train_bench  # noqa: PLC0415

    return train_bench


@pytest.mark.parametrize("decoding", ["autoregressive", "direct"])
def test_bench_config_pins_mse_on_the_raw_output(train_bench, monkeypatch, decoding):
    load = train_bench.config_lib.load

    def load_accuracy_defaults(path):  # What main's defaults are becoming.
        config = load(path)
        config.model.baseline, config.train.loss = "vol_band", "mae"
        config.train.loss_scale = "persistence"
        return config

    monkeypatch.setattr(train_bench.config_lib, "load", load_accuracy_defaults)
    args = train_bench.parse_args(["--quick"])
    config = train_bench.bench_config("gru", args, decoding, "float32")
    assert (config.model.decoding, config.model.baseline) == (decoding, "none")
    assert (config.train.loss, config.train.loss_scale) == ("mse", "none")


def test_each_ratio_times_torch_with_cpbjax_decoding(tb, train_bench, monkeypatch):
    """The bookkeeping of run_model, with a no-op cpbjax epoch and a recording torch call."""
    torch_calls = []

    def fake_torch_samples(model, series_windows, threads, device, decoding):
        torch_calls.append((decoding, threads))
        return [{"autoregressive": 2.0, "direct": 1.0}[decoding] / threads]

    def no_op_group(config, preps, k):
        return train_bench.Group(k, k, lambda s, a: (s, 0.0), None, None, 0.0, 0.0, 1.0, None, None)

    monkeypatch.setattr(train_bench.torch_side, "torch_samples", fake_torch_samples)
    monkeypatch.setattr(train_bench, "build_group", no_op_group)
    flags = "--quick --models gru --decoding autoregressive,direct --dtype float32,bfloat16"
    args = train_bench.parse_args(flags.split())
    results = train_bench.Results()
    train_bench.run_model("gru", args, results)
    threads = train_bench.torch_side.thread_settings("cpu")
    assert torch_calls == [(d, t) for d in ("autoregressive", "direct") for t in threads]
    rows = [
        (r["decoding"], r["dtype"], r["torch_decoding"], r["alternated"]) for r in results.ratios
    ]
    assert rows == [
        ("autoregressive", "float32", "autoregressive", "one round (A B)"),
        ("autoregressive", "bfloat16", "autoregressive", "no (torch of the same run)"),
        ("direct", "float32", "direct", "one round (A B)"),
        ("direct", "bfloat16", "direct", "no (torch of the same run)"),
    ]
    best = max(threads)  # The fake torch is fastest at the most threads.
    for r in results.ratios:
        expected = {"autoregressive": 2.0, "direct": 1.0}[r["decoding"]] / best * 2
        assert r["ratio"] == pytest.approx(expected / r["cpbjax_s_per_epoch"])
    torch_rows = [r["decoding"] for r in results.suite if r["system"] == "torch loop"]
    assert torch_rows == ["autoregressive", "direct"]

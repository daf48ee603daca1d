"""What a pooled network can learn beyond the band, on the window table of frame.py (issue
#42): a dense network (or a GRU with the context beside its summary) of the window and the
context, predicting each column's residual over the band in units of sigma, trained on the
MAE weighted as the product's loss (sigma / the series' persistence MAE). It prints the
tuning pairs' val skill per epoch (score.summary); test is never scored.

  python experiments/global_model/probe.py runs/gm/tuning.npz [--lr 1e-4] [--epochs 2]
      [--inputs window,context] [--drop PREFIXES] [--candles] [--raw] [--pooled-band]
      [--arch mlp|gru] [--hidden 256] [--layers 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.global_model import frame, score  # noqa: E402


def inputs(t, rows, args, stats=None):
    """[n, X] network inputs of `rows` and the standardisation (mean, std) they used."""
    cols = []
    if "window" in args.inputs:
        x_NL4 = t["x"][rows]
        if args.candles:  # each candle relative to the close before it
            x_NL4 = x_NL4 - np.concatenate([x_NL4[:, :1, 3:], x_NL4[:, :-1, 3:]], axis=1)
        elif args.sqrt_age:  # a random walk's spread at each lag: sqrt(candles to the end)
            x_NL4 = x_NL4 / np.sqrt(np.arange(x_NL4.shape[1], 0, -1))[None, :, None]
        cols.append(x_NL4.reshape(len(rows), -1))
    if "context" in args.inputs:
        ctx = t["ctx"][rows]
        cols += [np.nan_to_num(ctx), np.isnan(ctx[:, -1:]).astype(np.float32)]
        cols.append(np.log(t["sigma"][rows] + 1e-9)[:, None])
    f = np.concatenate(cols, 1).astype(np.float32)
    if args.raw:
        return f, None
    stats = stats or (f.mean(0), f.std(0) + 1e-6)
    return np.clip((f - stats[0]) / stats[1], -10, 10), stats


class DenseNet(nn.Module):
    hidden: int
    layers: int
    out: int

    @nn.compact
    def __call__(self, f):
        for _ in range(self.layers):
            f = nn.gelu(nn.Dense(self.hidden)(f))
        return nn.Dense(self.out, kernel_init=nn.initializers.zeros)(f)


class GRUHead(nn.Module):
    """A GRU over the window's candles; its last state and the other inputs feed the dense
    head (a direct-decoding GRU with the context beside its summary)."""

    hidden: int
    layers: int
    out: int
    window: int  # the first `window` inputs are the flattened [L, 4] window

    @nn.compact
    def __call__(self, f):
        h = nn.RNN(nn.GRUCell(self.hidden))(f[:, : self.window].reshape(f.shape[0], -1, 4))
        return DenseNet(self.hidden, self.layers, self.out)(
            jnp.concatenate([h[:, -1], f[:, self.window :]], axis=1)
        )


def table(args):
    """The window table with --drop's context columns left out, its band factors [S, H, 2]
    (one pooled band with --pooled-band) and persistence scales [S, 3]."""
    t = dict(np.load(args.table))
    if args.drop:
        gone = tuple(args.drop.split(","))
        names = [str(n) for n in t.get("ctx_names", frame.CONTEXT)]
        t["ctx"] = t["ctx"][:, [i for i, n in enumerate(names) if not n.startswith(gone)]]
    k = score.band_factors(t, (0,))
    if args.pooled_band:
        k = np.broadcast_to(np.nanmedian(k, axis=0), k.shape)
    return t, k, score.persistence_scale(t)


def trainer(args, net, steps, H):
    """(jitted step(params, opt, f, r, w) -> (params, opt, loss), optimizer): the product's
    chain (clip, Adam, warmup then cosine) on the weighted MAE of the residuals."""
    lr = optax.warmup_cosine_decay_schedule(
        args.lr * 0.01, args.lr, steps // 20, steps, args.lr * 0.01
    )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))

    @jax.jit
    def step(params, opt, f, r, w):
        def loss(p):
            return jnp.mean(jnp.abs(net.apply(p, f).reshape(-1, H, 3) - r) * w[:, None, :])

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    return step, tx


def run(args):
    t, k, scale = table(args)
    H = t["y"].shape[1]
    tr, va = np.flatnonzero(t["split"] == 0), np.flatnonzero(t["split"] == 1)
    f_tr, stats = inputs(t, tr, args)
    f_va, _ = inputs(t, va, args, stats)
    sig = t["sigma"][tr][:, None]
    r_tr = (t["y"][tr][..., score.COL_INDEX] - score.band_logs(t, k, tr)) / sig[..., None]
    w_tr = sig / scale[t["series"][tr]]  # [n, 3]
    if args.arch == "gru":
        net = GRUHead(args.hidden, args.layers, H * 3, t["x"].shape[1] * 4)
    else:
        net = DenseNet(args.hidden, args.layers, H * 3)
    params = net.init(jax.random.PRNGKey(args.seed), f_tr[:2])
    per_epoch = len(tr) // args.batch
    step, tx = trainer(args, net, args.epochs * per_epoch, H)
    opt, rng = tx.init(params), np.random.default_rng(args.seed + 1)
    band_va = score.band_logs(t, k, va)
    band = score.skills(t, va, band_va)
    predict = jax.jit(lambda p, f: net.apply(p, f).reshape(-1, H, 3))
    for epoch in range(args.epochs):
        order, losses = rng.permutation(len(tr)), []
        for s in range(per_epoch):
            b = order[s * args.batch : (s + 1) * args.batch]
            params, opt, value = step(params, opt, f_tr[b], r_tr[b], w_tr[b])
            if s % 200 == 0:
                losses.append(float(value))
        r_va = np.concatenate(
            [predict(params, f_va[i : i + 65536]) for i in range(0, len(va), 65536)]
        )
        pred = band_va + r_va * t["sigma"][va][:, None, None]
        row = {"epoch": epoch + 1, "train_loss": round(float(np.mean(losses)), 5)}
        print(json.dumps({**row, **score.summary(score.skills(t, va, pred), band)}), flush=True)
    return score.summary(band)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("table")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--inputs", default="window,context")
    p.add_argument("--drop", default="", help="context name prefixes left out, comma-separated")
    p.add_argument("--candles", action="store_true", help="each candle against the close before")
    p.add_argument("--raw", action="store_true", help="inputs not standardised")
    p.add_argument("--sqrt-age", action="store_true", help="lag j divided by sqrt(L - j)")
    p.add_argument("--pooled-band", action="store_true", help="one band (the median fit) for all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", default="mlp", choices=("mlp", "gru"))
    args = p.parse_args()
    started = time.perf_counter()
    band = run(args)
    print(
        json.dumps(
            {"args": vars(args), "band": band, "seconds": round(time.perf_counter() - started)}
        )
    )


if __name__ == "__main__":
    main()

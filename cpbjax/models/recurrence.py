"""The GRU and LSTM encoders' recurrence with a hand-written backward pass.

`config.recurrent_gradient=fused` runs each encoder layer as `EncoderLayer` here instead
of nn.RNN over the cell. Why: jax.grad of a lax.scan sums every weight gradient inside
the backward loop, one [I or D, B] x [B, G] product per step whose inner dimension is
the batch: small matmuls, one more per step in a loop that cannot overlap. The loop
here carries only the state gradients and returns each step's gate gradients; the
weight and input gradients are then one product over all L·B rows each, as torch's
fused RNN kernels do.

The forward pass is the cells' own op sequence (`models/gru.py`, `models/lstm.py`), so
forecasts are bit-identical to nn.RNN's and only the gradients change, in their last
bits (another summation order). The parameters are the cells' own too: same names,
shapes and initialisers, so a model trains and loads either way.

Shapes: G is the fused gate width (3·D for the GRU, 4·D for the LSTM); the scans run
over time, so their sequences are [L, B, ...].
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

GATES = {"gru": 3, "lstm": 4}


@dataclasses.dataclass(frozen=True)
class Spec:
    """What the recurrence is: the cell kind, and the matmuls' dtype and precision."""

    kind: str  # gru | lstm
    dtype: jnp.dtype
    precision: jax.lax.Precision


def _affine(spec: Spec, v, kernel, bias):
    """nn.Dense's computation, op for op (the cells' `_fused`), then float32."""
    v, kernel, bias = nn.dtypes.promote_dtype(v, kernel, bias, dtype=spec.dtype)
    y = jax.lax.dot_general(v, kernel, (((v.ndim - 1,), (0,)), ((), ())), precision=spec.precision)
    return (y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))).astype(jnp.float32)


def _dot(spec: Spec, a, b, dims: str):
    """A backward-pass product in the compute dtype, summed in float32."""
    a, b = a.astype(spec.dtype), b.astype(spec.dtype)
    return jnp.einsum(dims, a, b, precision=spec.precision, preferred_element_type=jnp.float32)


def _lstm_cell(c_BD, gates_BG):
    """LSTMCell's update from its summed gates: ((c', h'), h', the backward's residuals)."""
    i, f, g, o = jnp.split(gates_BG, 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    c_new = f * c_BD + i * g
    tanh_c = jnp.tanh(c_new)
    h_new = o * tanh_c
    return (c_new, h_new), h_new, (c_BD, i, f, g, o, tanh_c)


def _lstm_cell_grad(res, dstate):
    """Gradients of one LSTM step: (d gates [B, G], d state before without the W_h path).

    The gates are the sum of the input and hidden sides, so both get the same gradient.
    """
    c_prev, i, f, g, o, tanh_c = res
    dc, dh = dstate
    dc = dc + dh * o * (1.0 - tanh_c**2)
    d_BG = jnp.concatenate(
        [
            dc * g * i * (1 - i),
            dc * c_prev * f * (1 - f),
            dc * i * (1 - g**2),
            dh * tanh_c * o * (1 - o),
        ],
        axis=-1,
    )
    return d_BG, (dc * f, jnp.zeros_like(dh))  # h before reaches h' only via W_h.


def _gru_cell(h_BD, gx_BG, gh_BG):
    """GRUCell's update: (h' as the state, h' as the output, the backward's residuals)."""
    xr, xz, xn = jnp.split(gx_BG, 3, axis=-1)
    hr, hz, hn = jnp.split(gh_BG, 3, -1)
    r = jax.nn.sigmoid(xr + hr)
    z = jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * hn)
    h_new = (1.0 - z) * n + z * h_BD
    return h_new, h_new, (h_BD, r, z, n, hn)


def _gru_cell_grad(res, dh):
    """Gradients of one GRU step: (d input-side gates [B, G], d h before without the W_h path).

    The hidden side's gradient differs only in n's third (times r): `_hidden_side` makes
    it after the loop, so the loop stacks one [B, G] array per step, not two.
    """
    h_prev, r, z, n, hn = res
    dn = dh * (1.0 - z) * (1.0 - n**2)
    dr = dn * hn * r * (1.0 - r)
    dz = dh * (h_prev - n) * z * (1.0 - z)
    return jnp.concatenate([dr, dz, dn], axis=-1), dh * z


def _hidden_side(spec: Spec, res, dgx_LBG):
    """The hidden-side gate gradients [..., G] from the input side's (see the cell grads)."""
    if spec.kind == "lstm":
        return dgx_LBG
    r = res[1]  # [..., D]
    d = r.shape[-1]
    return jnp.concatenate([dgx_LBG[..., : 2 * d], dgx_LBG[..., 2 * d :] * r], axis=-1)


def _step(spec: Spec, weights, state, x_BI):
    """One cell step: (new state, output h [B, D], the backward's residuals)."""
    wi, bi, wh, bh = weights
    h_BD = state[1] if spec.kind == "lstm" else state
    gx_BG, gh_BG = _affine(spec, x_BI, wi, bi), _affine(spec, h_BD, wh, bh)
    if spec.kind == "lstm":
        new_state, out, res = _lstm_cell(state[0], gx_BG + gh_BG)
    else:
        new_state, out, res = _gru_cell(state, gx_BG, gh_BG)
    return new_state, out, res


def _add_to_h(spec: Spec, state, dh_BD):
    """state (h, or the LSTM's (c, h)) with dh added to its h."""
    return (state[0], state[1] + dh_BD) if spec.kind == "lstm" else state + dh_BD


def _forward(spec: Spec, x_LBI, weights):
    features = weights[2].shape[0]
    h0_BD = jnp.zeros((x_LBI.shape[1], features), jnp.float32)
    state = (h0_BD, h0_BD) if spec.kind == "lstm" else h0_BD

    def step(state, x_BI):
        new_state, out, res = _step(spec, weights, state, x_BI)
        return new_state, (out, res)

    final, (h_LBD, res) = jax.lax.scan(step, state, x_LBI)
    h_prev_LBD = jnp.concatenate([h0_BD[None], h_LBD[:-1]])  # the state each step read
    return (h_LBD, final), (res, h_prev_LBD, x_LBI, weights)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sequence(spec: Spec, x_LBI, weights):
    return _forward(spec, x_LBI, weights)[0]


def _backward(spec: Spec, saved, cotangents):
    res, h_prev_LBD, x_LBI, (wi, bi, wh, bh) = saved
    dh_LBD, dfinal = cotangents
    cell_grad = _lstm_cell_grad if spec.kind == "lstm" else _gru_cell_grad

    wh_GD = wh.T.astype(spec.dtype)  # Transposed once, not in every step.

    def step(dstate, xs):
        dh_out_BD, res_t = xs
        dgx_BG, dprev = cell_grad(res_t, _add_to_h(spec, dstate, dh_out_BD))
        dgh_BG = _hidden_side(spec, res_t, dgx_BG)
        return _add_to_h(spec, dprev, _dot(spec, dgh_BG, wh_GD, "bg,gd->bd")), dgx_BG

    _, dgx_LBG = jax.lax.scan(step, dfinal, (dh_LBD, res), reverse=True)
    dgh_LBG = _hidden_side(spec, res, dgx_LBG)
    grads = (
        _dot(spec, x_LBI, dgx_LBG, "lbi,lbg->ig"),
        dgx_LBG.sum((0, 1)),
        _dot(spec, h_prev_LBD, dgh_LBG, "lbd,lbg->dg"),
        dgh_LBG.sum((0, 1)),
    )
    return _dot(spec, dgx_LBG, wi, "lbg,ig->lbi").astype(x_LBI.dtype), grads


_sequence.defvjp(_forward, _backward)


class _Weights(nn.Module):
    """An nn.Dense's kernel [I, G] and bias [G], created as nn.Dense creates them."""

    features: int
    kernel_init: nn.initializers.Initializer

    @nn.compact
    def __call__(self, in_features: int):
        kernel = self.param("kernel", self.kernel_init, (in_features, self.features), jnp.float32)
        return kernel, self.param(
            "bias", nn.initializers.zeros_init(), (self.features,), jnp.float32
        )


class _CellWeights(nn.Module):
    """The cell's two fused layers, named as in GRUCell / LSTMCell ('input', 'hidden')."""

    features: int  # D
    gates: int  # G = gates · D

    @nn.compact
    def __call__(self, in_features: int):
        width = self.gates * self.features
        wi, bi = _Weights(width, nn.initializers.lecun_normal(), name="input")(in_features)
        wh, bh = _Weights(width, nn.initializers.orthogonal(), name="hidden")(self.features)
        return wi, bi, wh, bh


class EncoderLayer(nn.Module):
    """nn.RNN(cell, return_carry=True) over a GRU or LSTM cell, with the fused backward.

    Returns (final state, outputs [B, L, D]) as nn.RNN does: the state is h for the
    GRU and (c, h) for the LSTM.
    """

    features: int  # D
    spec: Spec

    def setup(self):
        self.cell = _CellWeights(self.features, GATES[self.spec.kind])

    def __call__(self, x_BLI):
        weights = self.cell(x_BLI.shape[-1])
        h_LBD, final = _sequence(self.spec, jnp.swapaxes(x_BLI, 0, 1), weights)
        return final, jnp.swapaxes(h_LBD, 0, 1)

"""The replaced system's PyTorch models, at their old sizes: the encoder-decoder
transformer (O(H^2) unmasked decoding), the GRU and the LSTM seq2seq, or each with
cpbjax's direct decoder (benchmarks/torch_baseline.py's module docstring says what is
faithful to the old system and why). `build_model` checks every parameter count
against cpbjax's own (EXPECTED_PARAMS).
"""

from __future__ import annotations

import math
import random

import torch
from torch import nn

MODELS = ("transformer", "gru", "lstm")
NUM_FEATURES = NUM_TARGETS = 4  # OHLC in, OHLC out, as the old system had it.
DECODINGS = ("autoregressive", "direct")
# cpbjax's parameter counts of the default configs (model.baseline='none', point forecasts).
EXPECTED_PARAMS = {
    ("transformer", "autoregressive"): 926_852,
    ("gru", "autoregressive"): 334_597,
    ("lstm", "autoregressive"): 1_984_772,
    ("transformer", "direct"): 928_132,
    ("gru", "direct"): 188_713,
    ("lstm", "direct"): 1_199_400,
}


class PositionalEncoding(nn.Module):
    """Fixed sinusoidal positional encoding added to a [B, S, D] sequence."""

    def __init__(self, d_model: int, max_len: int = 512):
        super().__init__()
        pos_S1 = torch.arange(max_len, dtype=torch.float32)[:, None]
        freq = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model)
        )
        pe_SD = torch.zeros(max_len, d_model)
        pe_SD[:, 0::2] = torch.sin(pos_S1 * freq)
        pe_SD[:, 1::2] = torch.cos(pos_S1 * freq)
        self.register_buffer("pe_SD", pe_SD)  # A buffer: not a parameter.

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        return x_BSD + self.pe_SD[: x_BSD.shape[1]]


class TransformerSeq2Seq(nn.Module):
    """The old encoder-decoder transformer with its O(H^2) unmasked decoding, or direct."""

    teacher_forcing_in_validation = True  # The old system's quirk, kept.

    def __init__(
        self, horizon: int, decoding: str, d_model=128, nhead=8, layers=2, ff_dim=512, dropout=0.1
    ):
        super().__init__()
        self.horizon, self.decoding = horizon, decoding
        self.input_proj = nn.Linear(NUM_FEATURES, d_model)
        self.pos = PositionalEncoding(d_model)
        block = dict(dim_feedforward=ff_dim, dropout=dropout, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d_model, nhead, **block), layers, enable_nested_tensor=False
        )
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(d_model, nhead, **block), layers
        )
        self.output_proj = nn.Linear(d_model, NUM_TARGETS)
        if decoding == "direct":  # cpbjax's `queries`: H learned decoder inputs, no positions.
            self.queries_HD = nn.Parameter(torch.randn(horizon, d_model) * 0.02)

    def forward(self, x_BLF, y_BHC=None, teacher_forcing: float = 0.0):
        memory_BLD = self.encoder(self.pos(self.input_proj(x_BLF)))
        if self.decoding == "direct":  # All H steps in one unmasked decoder pass.
            queries_BHD = self.queries_HD.expand(x_BLF.shape[0], -1, -1)
            return self.output_proj(self.decoder(queries_BHD, memory_BLD))
        tokens = [x_BLF.new_zeros(x_BLF.shape[0], 1, memory_BLD.shape[-1])]  # The zero token.
        preds = []
        for t in range(self.horizon):
            # No mask and no cache: the whole sequence so far goes through again.
            out_BTD = self.decoder(self.pos(torch.cat(tokens, dim=1)), memory_BLD)
            pred_BC = self.output_proj(out_BTD[:, -1])
            preds.append(pred_BC)
            if t + 1 < self.horizon:
                use_true = y_BHC is not None and random.random() < teacher_forcing
                tokens.append(self.input_proj(y_BHC[:, t] if use_true else pred_BC)[:, None])
        return torch.stack(preds, dim=1)


def _head(hidden: int, horizon: int, decoding: str) -> nn.Sequential:
    """[decoder or last encoder output; context] -> C values (one step) or H x C (direct)."""
    out = NUM_TARGETS * (horizon if decoding == "direct" else 1)
    return nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, out))


def _direct_forecast(head: nn.Sequential, last_BH, context_BH, horizon: int) -> torch.Tensor:
    """cpbjax's direct RNN head: all H candles [B, H, C] from the window summary at once."""
    return head(torch.cat([last_BH, context_BH], dim=-1)).view(-1, horizon, NUM_TARGETS)


class GRUSeq2Seq(nn.Module):
    """The old GRU seq2seq: attention-pooled context, step-by-step GRU decoder (or direct)."""

    teacher_forcing_in_validation = False

    def __init__(self, horizon: int, decoding: str, hidden=128, layers=2, dropout=0.3):
        super().__init__()
        self.horizon, self.decoding = horizon, decoding
        self.encoder = nn.GRU(NUM_FEATURES, hidden, layers, dropout=dropout, batch_first=True)
        self.attention = nn.Linear(hidden, 1)
        if decoding == "autoregressive":  # Direct decoding has no decoder, as in cpbjax.
            self.decoder = nn.GRU(NUM_TARGETS, hidden, layers, dropout=dropout, batch_first=True)
        self.head = _head(hidden, horizon, decoding)

    def forward(self, x_BLF, y_BHC=None, teacher_forcing: float = 0.0):
        enc_BLH, state = self.encoder(x_BLF)
        weights_BL1 = torch.softmax(self.attention(enc_BLH), dim=1)
        context_BH = (weights_BL1 * enc_BLH).sum(dim=1)
        if self.decoding == "direct":
            return _direct_forecast(self.head, enc_BLH[:, -1], context_BH, self.horizon)
        use_true = y_BHC is not None and random.random() < teacher_forcing  # Once per batch.
        inp_B1C = x_BLF.new_zeros(x_BLF.shape[0], 1, NUM_TARGETS)
        preds = []
        for t in range(self.horizon):
            dec_B1H, state = self.decoder(inp_B1C, state)
            pred_BC = self.head(torch.cat([dec_B1H[:, 0], context_BH], dim=-1))
            preds.append(pred_BC)
            inp_B1C = (y_BHC[:, t] if use_true else pred_BC)[:, None]
        return torch.stack(preds, dim=1)


class LSTMSeq2Seq(nn.Module):
    """The old LSTM seq2seq: 4-head attention from each decoder step over the encoder.

    Direct: one query, the encoder's last output, attends over the encoder outputs.
    """

    teacher_forcing_in_validation = False

    def __init__(self, horizon: int, decoding: str, hidden=256, layers=2, dropout=0.3, heads=4):
        super().__init__()
        self.horizon, self.decoding = horizon, decoding
        self.encoder = nn.LSTM(NUM_FEATURES, hidden, layers, dropout=dropout, batch_first=True)
        if decoding == "autoregressive":  # Direct decoding has no decoder, as in cpbjax.
            self.decoder = nn.LSTM(NUM_TARGETS, hidden, layers, dropout=dropout, batch_first=True)
        self.attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.head = _head(hidden, horizon, decoding)

    def forward(self, x_BLF, y_BHC=None, teacher_forcing: float = 0.0):
        enc_BLH, state = self.encoder(x_BLF)
        if self.decoding == "direct":
            last_B1H = enc_BLH[:, -1:]
            att_B1H, _ = self.attention(last_B1H, enc_BLH, enc_BLH)
            return _direct_forecast(self.head, last_B1H[:, 0], att_B1H[:, 0], self.horizon)
        use_true = y_BHC is not None and random.random() < teacher_forcing  # Once per batch.
        inp_B1C = x_BLF.new_zeros(x_BLF.shape[0], 1, NUM_TARGETS)
        preds = []
        for t in range(self.horizon):
            dec_B1H, state = self.decoder(inp_B1C, state)
            # Keys/values of the encoder are projected again at every step.
            att_B1H, _ = self.attention(dec_B1H, enc_BLH, enc_BLH)
            pred_BC = self.head(torch.cat([dec_B1H[:, 0], att_B1H[:, 0]], dim=-1))
            preds.append(pred_BC)
            inp_B1C = (y_BHC[:, t] if use_true else pred_BC)[:, None]
        return torch.stack(preds, dim=1)


_MODEL_CLASSES = {"transformer": TransformerSeq2Seq, "gru": GRUSeq2Seq, "lstm": LSTMSeq2Seq}


def count_params(model: nn.Module) -> int:
    """Number of trainable parameters (buffers such as the positional table excluded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_model(name: str, horizon: int = 10, decoding: str = "autoregressive") -> nn.Module:
    """Builds one old model at its fixed old size and checks its parameter count.

    Raises:
      ValueError: for an unknown model name or decoding.
      RuntimeError: if the parameter count differs from cpbjax's (EXPECTED_PARAMS).
    """
    if name not in _MODEL_CLASSES:
        raise ValueError(f"model {name!r} is not one of {', '.join(MODELS)}")
    if decoding not in DECODINGS:
        raise ValueError(f"decoding {decoding!r} is not one of {', '.join(DECODINGS)}")
    model = _MODEL_CLASSES[name](horizon, decoding)
    n, expected = count_params(model), EXPECTED_PARAMS[name, decoding]
    if n != expected:
        raise RuntimeError(f"torch {name} {decoding} has {n:,} parameters, expected {expected:,}")
    return model

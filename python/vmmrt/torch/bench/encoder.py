# SPDX-License-Identifier: LGPL-2.1-or-later
"""PyTorch's own encoder layer, for the benchmark: a layer written by others
than the benchmark, with biases, LayerNorm and nn.MultiheadAttention.

``torch.nn.TransformerEncoderLayer(d_model=hidden, nhead=heads,
dim_feedforward=ffn, batch_first=True, norm_first=True, dropout=0.0)`` in the
benchmark's dtype; attention is bidirectional (no mask), through
scaled_dot_product_attention where torch has it. The front's shape (and
``--preset encoder``) is d 4096, ffn 16384, 32 heads, seq 4096, 6 layers.
"""
import torch

from vmmrt.torch.bench import llama


def encoder_layers(n, shape, device, dtype=torch.bfloat16, seed=1234):
    """n torch.nn.TransformerEncoderLayers in shape (hidden, ffn, heads; kv heads unused)."""
    layers = [torch.nn.TransformerEncoderLayer(d_model=shape.hidden, nhead=shape.heads, dim_feedforward=shape.ffn,
                                               batch_first=True, norm_first=True, dropout=0.0, device=device,
                                               dtype=dtype)
              for _ in range(n)]
    return llama.init_(layers, seed)

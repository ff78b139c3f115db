# SPDX-License-Identifier: LGPL-2.1-or-later
"""Llama-style decoder layers for the benchmark and the tests.

:class:`DecoderLayer` is written with plain torch ops (RMSNorm, rotary
embeddings, grouped-query attention through scaled_dot_product_attention,
SwiGLU MLP), so it runs on any PyTorch this package supports: without
scaled_dot_product_attention (torch 1.13) attention is computed with the same
math as its math backend. ``attention="math"`` forces that backend on CUDA
too: its kernels are deterministic, so gradients can be compared bitwise.

:func:`hf_layers` builds Hugging Face transformers' LlamaDecoderLayer in the
same shape, when transformers is installed.
"""
import contextlib
import math
import re

import torch
import torch.nn.functional as F

from vmmrt.torch import _compat


class Shape:
    """A decoder layer's shape; the default is Llama-3-8B at seq 4096, batch 1."""

    def __init__(self, hidden=4096, ffn=14336, heads=32, kv_heads=8, seq=4096, batch=1, eps=1e-5,
                 rope_theta=500000.0):
        if hidden % heads or heads % kv_heads:
            raise ValueError("hidden %d, heads %d, kv heads %d do not divide" % (hidden, heads, kv_heads))
        self.hidden, self.ffn, self.heads, self.kv_heads = hidden, ffn, heads, kv_heads
        self.seq, self.batch, self.eps, self.rope_theta = seq, batch, eps, rope_theta

    @property
    def head_dim(self):
        return self.hidden // self.heads

    def as_dict(self):
        return dict(hidden=self.hidden, ffn=self.ffn, heads=self.heads, kv_heads=self.kv_heads, seq=self.seq,
                    batch=self.batch)


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps, **kw):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim, **kw))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(shape, device, dtype):
    d = shape.head_dim
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    t = torch.arange(shape.seq, device=device, dtype=torch.float32)
    f = torch.outer(t, inv)
    emb = torch.cat((f, f), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _math_attention(q, k, v):
    """scaled_dot_product_attention(is_causal=True), as its math backend computes it."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-2, -1) * scale
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@contextlib.contextmanager
def attention_backend(kind):
    """Force sdpa's math backend ("math"); "flash"/"auto" leave PyTorch's choice."""
    if kind != "math" or not _compat.HAS_SDPA or not torch.cuda.is_available():
        yield
        return
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ctx = sdpa_kernel(SDPBackend.MATH)
    except ImportError:
        ctx = torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False, enable_math=True)
    with ctx:
        yield


class DecoderLayer(torch.nn.Module):
    """x -> x + attn(norm(x)); -> h + mlp(norm(h)), Llama style."""

    def __init__(self, shape, device=None, dtype=torch.bfloat16, attention="auto"):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        s = shape
        self.shape = s
        self.attention = attention
        self.input_norm = RMSNorm(s.hidden, s.eps, **kw)
        self.q_proj = torch.nn.Linear(s.hidden, s.heads * s.head_dim, bias=False, **kw)
        self.k_proj = torch.nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False, **kw)
        self.v_proj = torch.nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False, **kw)
        self.o_proj = torch.nn.Linear(s.heads * s.head_dim, s.hidden, bias=False, **kw)
        self.post_norm = RMSNorm(s.hidden, s.eps, **kw)
        self.gate_proj = torch.nn.Linear(s.hidden, s.ffn, bias=False, **kw)
        self.up_proj = torch.nn.Linear(s.hidden, s.ffn, bias=False, **kw)
        self.down_proj = torch.nn.Linear(s.ffn, s.hidden, bias=False, **kw)
        cos, sin = rope_tables(s, device, dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _attend(self, q, k, v):
        rep = self.shape.heads // self.shape.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if _compat.HAS_SDPA and not (self.attention == "math" and not q.is_cuda):
            with attention_backend(self.attention):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return _math_attention(q, k, v)

    def forward(self, x):
        s = self.shape
        b, n, _ = x.shape
        h = self.input_norm(x)
        q = self.q_proj(h).view(b, n, s.heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        cos, sin = self.cos[:n], self.sin[:n]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        a = self._attend(q, k, v).transpose(1, 2).reshape(b, n, s.hidden)
        x = x + self.o_proj(a)
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def init_(layers, seed=1234):
    """The same weights for the same seed on the same device (drawn there: a
    CPU generator would spend seconds on billions of numbers)."""
    gens = {}
    with torch.no_grad():
        for m in layers:
            for name, p in m.named_parameters():
                g = gens.get(p.device)
                if g is None:
                    g = gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
                w = torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
                if re.search(r"norm\d*\.weight$", name) or "layernorm" in name:
                    w = 1.0 + 0.1 * w
                elif name.endswith("bias"):
                    # (torch's encoder layer has biases; a scale of 1/sqrt(n)
                    # for n = their length would make them noise)
                    w *= 0.02
                else:
                    w /= math.sqrt(p.shape[-1])
                p.copy_(w)
    return layers


def torch_layers(n, shape, device, dtype=torch.bfloat16, attention="auto", seed=1234):
    return init_([DecoderLayer(shape, device, dtype, attention) for _ in range(n)], seed)


class HFLayer(torch.nn.Module):
    """transformers' LlamaDecoderLayer with its rotary embedding, taking and
    returning hidden states only (causal attention, no cache)."""

    def __init__(self, layer, rotary, seq, attention):
        super().__init__()
        self.layer = layer
        self.rotary = rotary
        self.seq = seq
        self.attention = attention

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        cos, sin = self.rotary(x, pos)
        with attention_backend(self.attention):
            out = self.layer(x, position_embeddings=(cos, sin), position_ids=pos, attention_mask=None)
        return out[0] if isinstance(out, tuple) else out


def hf_layers(n, shape, device, dtype=torch.bfloat16, attention="auto", seed=1234):
    """n transformers LlamaDecoderLayers in shape; raises ImportError without transformers."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    cfg = LlamaConfig(hidden_size=shape.hidden, intermediate_size=shape.ffn, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=max(shape.seq, 8192),
                      rms_norm_eps=shape.eps, rope_theta=shape.rope_theta, attention_dropout=0.0,
                      num_hidden_layers=n)
    cfg._attn_implementation = "sdpa"
    out = []
    for i in range(n):
        layer = LlamaDecoderLayer(cfg, layer_idx=i).to(device=device, dtype=dtype)
        try:
            rotary = LlamaRotaryEmbedding(config=cfg, device=device)
        except TypeError:   # transformers 5: no device argument
            rotary = LlamaRotaryEmbedding(config=cfg).to(device)
        out.append(HFLayer(layer, rotary, shape.seq, attention))
    return init_(out, seed)

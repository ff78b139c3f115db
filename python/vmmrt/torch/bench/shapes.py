# SPDX-License-Identifier: LGPL-2.1-or-later
"""The front's named shapes: which layers, how many, in which shape, and a
tiny version of each (``smoke``) that runs in seconds on the CPU.

llama     8 Llama-3-8B layers written with torch ops, seq 4096
launch    16 torch-ops layers, hidden 1024, ffn 4096, seq 1024: launch-bound
          (a step is ~13 ms on the H200, where graphs matter most)
encoder   6 torch.nn.TransformerEncoderLayer, d 4096, ffn 16384, 32 heads, seq 4096
hf        4 of transformers' LlamaDecoderLayer (Llama-3-8B), seq 4096
megatron  4 of megatron-core's TransformerLayer (local spec, Llama-3-8B), seq 2048
long      4 Llama-3-8B layers written with torch ops, seq 32768: long context,
          where activations outweigh the parameters and optimizer states

:func:`build` makes a shape's layers (the same weights for the same seed)
and says the input's dimensions; :class:`Unavailable` when the layer's
package is not installed (or, for megatron-core, there is no CUDA).
"""

import torch

from vmmrt.torch.bench import encoder, llama

# Llama-3-8B's layer: hidden 4096, ffn 14336, 32 heads, 8 kv heads.
_L3 = dict(hidden=4096, ffn=14336, heads=32, kv_heads=8)
_TINY = dict(hidden=64, ffn=176, heads=4, kv_heads=2, seq=64)
_TINY_CUDA = dict(hidden=256, ffn=704, heads=4, kv_heads=2, seq=256)


class Spec:
    """One named shape: ``kind`` (torch, hf, encoder, megatron), ``layers``
    and the dimensions; ``title`` in the user's words."""

    def __init__(self, name, kind, layers, title, hidden, ffn, heads, kv_heads, seq, batch=1):
        self.name, self.kind, self.layers, self.title = name, kind, layers, title
        self.shape = llama.Shape(hidden, ffn, heads, kv_heads, seq, batch)

    def smoke(self, device):
        """The tiny version (3 layers; 4 for the launch-bound one): the same
        layer code, dimensions the CPU runs in a fraction of a second."""
        d = _TINY if device == "cpu" else _TINY_CUDA
        layers = 4 if self.name == "launch" else 3
        return Spec(self.name, self.kind, layers, self.title + " (smoke: tiny)", batch=1, **d)

    def describe(self):
        s = self.shape
        return "%d x %s: hidden %d, ffn %d, %d heads (%d kv), seq %d, batch %d" % (
            self.layers, self.title, s.hidden, s.ffn, s.heads, s.kv_heads, s.seq, s.batch)

    def as_dict(self):
        return dict(name=self.name, kind=self.kind, layers=self.layers, title=self.title, **self.shape.as_dict())


SHAPES = {
    "llama": Spec("llama", "torch", 8, "torch-ops Llama-3-8B layer", seq=4096, **_L3),
    "launch": Spec("launch", "torch", 16, "torch-ops Llama-style layer (launch-bound)", hidden=1024, ffn=4096,
                   heads=32, kv_heads=8, seq=1024),
    "encoder": Spec("encoder", "encoder", 6, "torch.nn.TransformerEncoderLayer", hidden=4096, ffn=16384, heads=32,
                    kv_heads=32, seq=4096),
    "hf": Spec("hf", "hf", 4, "transformers LlamaDecoderLayer", seq=4096, **_L3),
    "megatron": Spec("megatron", "megatron", 4, "megatron-core TransformerLayer (local spec)", seq=2048, **_L3),
    "long": Spec("long", "torch", 4, "torch-ops Llama-3-8B layer (long context)", seq=32768, **_L3),
}

class Unavailable(Exception):
    """The shape's layers cannot be built here (a package missing, no CUDA)."""


def build(spec, device, dtype, attention="auto", seed=1234):
    """(layers, input dimensions) of ``spec`` on ``device``."""
    s, n = spec.shape, spec.layers
    dims = (s.batch, s.seq, s.hidden)
    if spec.kind == "torch":
        return llama.torch_layers(n, s, device, dtype, attention, seed), dims
    if spec.kind == "encoder":
        return encoder.encoder_layers(n, s, device, dtype, seed), dims
    if spec.kind == "hf":
        try:
            return llama.hf_layers(n, s, device, dtype, attention, seed), dims
        except ImportError as e:
            raise Unavailable("transformers is not installed (%s)" % e)
    if spec.kind == "megatron":
        return megatron_layers(n, s, device, dtype, seed), (s.seq, s.batch, s.hidden)
    raise ValueError("unknown layer kind %r" % spec.kind)


class MegatronLayer(torch.nn.Module):
    """One megatron-core TransformerLayer taking and returning hidden states
    ([seq, batch, hidden], Megatron's layout) with the rotary embedding of
    its sequence as a buffer, causal attention, no mask tensor."""

    # Megatron's RNG tracker swaps its graph-safe generator states into the
    # default generator: a capture that torch aborts midway (a checkpoint
    # reading the RNG state under capture) leaves the state swapped in marked
    # as capturing for good, and every later capture or random op of the
    # process fails ("Offset increment outside graph capture"). So its
    # checkpoints preserve no RNG state (dropout 0: nothing is random), and
    # each point starts from fresh tracker states (reseed).
    rng_tracked = True

    def __init__(self, layer, rope, seed=1234):
        super().__init__()
        self.layer = layer
        self.seed = seed
        self.register_buffer("rope", rope, persistent=False)

    def reseed(self):
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        model_parallel_cuda_manual_seed(self.seed, use_cudagraphable_rng=True)

    def forward(self, x):
        out = self.layer(hidden_states=x, attention_mask=None, rotary_pos_emb=self.rope)
        return out[0] if isinstance(out, tuple) else out


def megatron_layers(n, shape, device, dtype=torch.bfloat16, seed=1234):
    """n megatron-core TransformerLayers (local spec: RMSNorm, GQA, SwiGLU,
    Megatron's own attention), tensor and pipeline parallel 1, as
    examples/megatron_gpt.py builds them."""
    if torch.device(device).type != "cuda":
        raise Unavailable("megatron-core's layers need CUDA")
    try:
        import torch.nn.functional as F
        from megatron.core import parallel_state
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.spec_utils import build_module
        from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError as e:
        raise Unavailable("megatron-core is not installed (%s)" % e)
    if not torch.distributed.is_initialized():
        # A world of one needs no rendezvous: an in-process store, not a TCP
        # port (a fixed port is taken by the front's own process when it runs
        # a point alone in a child, which then fails with EADDRINUSE).
        torch.distributed.init_process_group("nccl", store=torch.distributed.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    # the graph-safe RNG tracker, so that graphs may capture Megatron's generators
    model_parallel_cuda_manual_seed(seed, use_cudagraphable_rng=True)
    cfg = TransformerConfig(num_layers=n, hidden_size=shape.hidden, num_attention_heads=shape.heads,
                            num_query_groups=shape.kv_heads, ffn_hidden_size=shape.ffn, normalization="RMSNorm",
                            gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                            bf16=dtype == torch.bfloat16, params_dtype=dtype, pipeline_dtype=dtype,
                            hidden_dropout=0.0, attention_dropout=0.0)
    spec = get_gpt_layer_local_spec()
    try:
        rope = RotaryEmbedding(kv_channels=cfg.kv_channels, rotary_percent=1.0, rotary_base=int(shape.rope_theta))
    except TypeError:           # a megatron-core before rotary_base=
        rope = RotaryEmbedding(kv_channels=cfg.kv_channels, rotary_percent=1.0)
    emb = rope(shape.seq).to(device)
    layers = [MegatronLayer(build_module(spec, config=cfg, layer_number=i + 1), emb, seed).to(device)
              for i in range(n)]
    return llama.init_(layers, seed)

"""Memory per GPU of RL training at scale, by arithmetic from each model's configuration.

Prints, for 7B / 32B / 72B dense models, Qwen3-235B-A22B and DeepSeek-V3 (671B), on nodes
of 8 x H100 80 GB or 8 x H200 141 GB:

- the model's bytes: weights (bf16), gradients and AdamW state of fp32 master weights;
- activations per token of a micro-batch with gradient checkpointing, and the engine's KV
  cache per token;
- per layout (FSDP2; FSDP2 + tensor parallel; + Ulysses; Megatron-Core TP/PP/EP), the
  training memory per GPU on the fewest nodes where it fits, and that node count.

Nothing is measured: the numbers follow from the formulas below, for a reader to check.

Training state (ZeRO-3 / FSDP2, mixed precision with fp32 master weights): 4 bytes of
parameter + 4 of gradient + 8 of AdamW moments = 16 bytes per parameter, divided over the
GPUs that shard it. FSDP2 also holds one unsharded layer (bf16, two with prefetch) while it
computes: for an MoE layer that is every expert of the layer, which is what makes FSDP2
alone fail for large MoE models; tensor and expert parallelism split that buffer.

Activations with checkpointing (Korthikanti et al. 2022, arXiv:2205.05198, flash attention,
bf16): each layer keeps its input, 2·h bytes per token; the layer being recomputed holds
about 34·h bytes per token (dense MLP with ``intermediate`` = 4h scales that term; an MoE
layer counts its active experts). Tensor parallelism with sequence parallelism divides
both by t; Ulysses divides the tokens per GPU by its size; log-probs are computed in
chunks (no full-vocabulary logits for the whole sequence).

KV cache (bf16): 2 · layers · kv_heads · head_dim · 2 bytes per token; DeepSeek-V3's MLA
caches its latent, (kv_lora_rank + rope dims) · 2 bytes per layer.

Usage: ``python benchmarks/scale_memory.py [--tokens 16384] [--headroom 0.9]``
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GB = 1e9
STATE_BYTES = 16  # fp32 param + fp32 grad + AdamW m, v
#: FSDP2 moves every weight to every GPU for the forward and again for the backward (bf16
#: all-gathers), and reduce-scatters the gradients (bf16): about 6 bytes a parameter per
#: micro-batch, divided by the tensor-parallel size.
FSDP_TRAFFIC_BYTES = 6
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Model:
    """The shape facts that set memory (from each model's ``config.json``)."""

    name: str
    params: float  # total parameters
    active: float  # parameters a token passes through
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    intermediate: int  # MLP width a token passes through (MoE: active experts' total)
    experts: int = 1  # routed experts per layer
    kv_latent: int = 0  # MLA: cached dims per layer (kv_lora_rank + rope), else 0
    expert_params: float = 0.0  # parameters in routed experts (the rest is dense)
    heads: int = 0  # attention heads; 0: hidden / head_dim

    @property
    def attention_heads(self) -> int:
        return self.heads or self.hidden // self.head_dim

    def rlkit_tensor_parallel(self) -> int:
        """The largest ``ModelConfig.tensor_parallel_size`` up to a node's 8 GPUs that rlkit
        can use: it must divide the attention and key/value heads; 0 for multi-head latent
        attention (no plan)."""
        if self.kv_latent:
            return 0
        return max(t for t in (1, 2, 4, 8) if not (self.attention_heads % t or self.kv_heads % t))

    @property
    def layer_params(self) -> float:
        """Parameters of one layer (all experts), the unit FSDP2 gathers."""
        return self.params / self.layers

    def kv_bytes_per_token(self) -> int:
        if self.kv_latent:
            return self.layers * self.kv_latent * 2
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def activation_bytes_per_token(self) -> float:
        """Checkpointed layer inputs plus one layer recomputed (module docstring)."""
        recompute = 34 * self.hidden * max(1.0, self.intermediate / (4 * self.hidden))
        return self.layers * 2 * self.hidden + recompute


MODELS = (
    Model("Qwen2.5-7B", 7.62e9, 7.62e9, 28, 3584, 4, 128, 18944),
    Model("Qwen2.5-32B", 32.8e9, 32.8e9, 64, 5120, 8, 128, 27648),
    Model("Qwen2.5-72B", 72.7e9, 72.7e9, 80, 8192, 8, 128, 29568),
    # Experts: 94 layers x 128 x 3 matrices of 4096 x 1536.
    Model(
        "Qwen3-235B-A22B",
        235e9,
        22e9,
        94,
        4096,
        4,
        128,
        8 * 1536,
        128,
        0,
        94 * 128 * 3 * 4096 * 1536,
        64,
    ),
    # Experts: 58 MoE layers x 256 x 3 matrices of 7168 x 2048; MLA caches 512 + 64 dims.
    Model(
        "DeepSeek-V3 (671B)",
        671e9,
        37e9,
        61,
        7168,
        128,
        128,
        9 * 2048,
        256,
        512 + 64,
        58 * 256 * 3 * 7168 * 2048,
        128,
    ),
)
GPUS = (("8 x H100 80 GB", 80.0), ("8 x H200 141 GB", 141.0))


@dataclass(frozen=True)
class Layout:
    """How one step's model is split: ``tp`` tensor, ``sp`` Ulysses, ``pp`` pipeline
    stages, ``ep`` expert parallel; the rest of the GPUs shard with FSDP2 / data parallel."""

    name: str
    tp: int = 1
    sp: int = 1
    pp: int = 1  # 0: the fewest stages (1, 2, 4, 8, 16) that fit
    ep: int = 1
    fsdp: bool = True  # the state is sharded over every GPU (ZeRO-3); else over tp*pp*ep
    runs_today: bool = False


LAYOUTS = (
    Layout("FSDP2", runs_today=True),
    Layout("FSDP2 + Ulysses 8", sp=8, runs_today=True),
    Layout("FSDP2 + TP 8", tp=8, runs_today=True),
    Layout("FSDP2 + TP 8 + Ulysses 2", tp=8, sp=2),
    Layout("Megatron-Core TP 8 (EP for experts), PP as needed", tp=8, pp=0, fsdp=False),
)


def per_gpu_gb(model: Model, layout: Layout, gpus: int, tokens: int, pp: int = 1) -> float:
    """Training memory of one GPU (GB): its share of the state, the gathered layer, and
    the activations of ``tokens`` tokens per micro-batch."""
    if layout.fsdp:
        state = STATE_BYTES * model.params / gpus
        # One unsharded layer in bf16, twice (the next one is prefetched), split by TP (and
        # EP over the experts).
        gathered = 2 * 2 * model.layer_params / layout.tp / (layout.ep if model.experts > 1 else 1)
    else:
        state, gathered = _megatron_state(model, layout, gpus, pp), 0.0
    # 1F1B keeps up to pp micro-batches of a stage's layers in flight: the first stage
    # holds about one micro-batch of every layer, so PP does not shrink activations.
    acts = model.activation_bytes_per_token() * tokens / (layout.tp * layout.sp)
    return (state + gathered + acts) / GB


def _megatron_state(model: Model, layout: Layout, gpus: int, pp: int) -> float:
    """Megatron-Core with its distributed optimizer: each GPU holds its TP (dense) or EP
    (experts) share of one pipeline stage as bf16 weights and fp32 gradient buffers (6
    bytes a parameter), and its data-parallel share of the fp32 master weights and AdamW
    moments (12 bytes). Experts are spread over up to ``gpus / pp`` ranks (EP folded over
    the TP and data-parallel ranks), at most one expert per rank."""
    dense = model.params - model.expert_params
    ep = min(model.experts, gpus // pp) if model.experts > 1 else 1
    out = 0.0
    for params, split in ((dense, layout.tp), (model.expert_params, ep)):
        per_rank = params / split / pp
        dp = max(1, gpus // (split * pp))
        out += 6 * per_rank + 12 * per_rank / dp
    return out


def fewest_nodes(
    model: Model, layout: Layout, memory_gb: float, tokens: int, headroom: float
) -> tuple[int, float, int] | None:
    """The fewest nodes (up to 64) on which the layout fits: (nodes, GB per GPU there,
    pipeline stages)."""
    for nodes in range(1, 65):
        gpus = nodes * GPUS_PER_NODE
        for pp in (1, 2, 4, 8, 16) if layout.pp == 0 else (layout.pp,):
            if gpus % (layout.tp * layout.sp * pp):
                continue
            need = per_gpu_gb(model, layout, gpus, tokens, pp)
            if need <= headroom * memory_gb:
                return nodes, need, pp
    return None


def model_table(tokens: int) -> str:
    rows = [
        "| model | params (active) | weights bf16 | training state (16 B/param) | activations / token | "
        f"activations, {tokens} tokens | KV cache / token | KV, 1M tokens | layer FSDP gathers (bf16) | "
        "FSDP2 traffic / micro-batch / GPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in MODELS:
        act = m.activation_bytes_per_token()
        rows.append(
            f"| {m.name} | {m.params / 1e9:.0f}B ({m.active / 1e9:.0f}B) | "
            f"{2 * m.params / GB:,.0f} GB | {STATE_BYTES * m.params / GB:,.0f} GB | "
            f"{act / 1e3:,.0f} KB | {act * tokens / GB:,.1f} GB | "
            f"{m.kv_bytes_per_token() / 1e3:,.0f} KB | {m.kv_bytes_per_token() * 1e6 / GB:,.0f} GB | "
            f"{2 * m.layer_params / GB:,.1f} GB | {FSDP_TRAFFIC_BYTES * m.params / GB:,.0f} GB |"
        )
    return "\n".join(rows)


def layout_table(memory_gb: float, tokens: int, headroom: float) -> str:
    head = "| model | " + " | ".join(layout.name for layout in LAYOUTS) + " |"
    rows = [head, "|---|" + "---|" * len(LAYOUTS)]
    for m in MODELS:
        cells = []
        for layout in LAYOUTS:
            found = fewest_nodes(m, layout, memory_gb, tokens, headroom)
            if found is None:
                cells.append("no fit in 64 nodes")
            else:
                stages = f", PP {found[2]}" if layout.pp == 0 else ""
                cells.append(f"{found[0]} node(s){stages}, {found[1]:.0f} GB")
        rows.append(f"| {m.name} | " + " | ".join(cells) + " |")
    today = ", ".join(layout.name for layout in LAYOUTS if layout.runs_today)
    rows.append(f"\nrlkit runs today: {today}.")
    sizes = "; ".join(
        f"{m.name} {m.rlkit_tensor_parallel() or 'none (MLA: no plan)'}" for m in MODELS
    )
    rows.append(
        "rlkit's largest tensor-parallel size on a node (it must divide the attention and "
        f"key/value heads): {sizes}. It keeps each layer's input whole on every "
        "tensor-parallel process (no sequence parallelism) and replicates the experts, so "
        "its memory under TP is above the column's for activations and for the "
        "mixture-of-experts rows; TP with Ulysses is refused."
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per micro-batch")
    parser.add_argument("--headroom", type=float, default=0.9, help="usable fraction of a GPU")
    args = parser.parse_args(argv)
    print(f"## Per model ({args.tokens} tokens per micro-batch)\n")
    print(model_table(args.tokens))
    for name, memory in GPUS:
        print(f"\n## Training memory per GPU on the fewest nodes of {name} "
              f"({args.headroom:.0%} usable, {args.tokens} tokens per micro-batch)\n")  # fmt: skip
        print(layout_table(memory, args.tokens, args.headroom))


if __name__ == "__main__":
    main()

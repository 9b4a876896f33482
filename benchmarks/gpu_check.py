"""One GPU check: update step, rollout, fused log-probs, remove-padding and FSDP2 in one table.

Every model is a random Qwen2 built in process (no hub, no network). Sections, each
timed, each one or more rows of ONE final Markdown table (section | setting | metric |
value | note); a section that fails puts its error in the table and the next one runs:

1. ``update step``: ``ActorModule`` forward + backward + AdamW step on random Qwen2 at
   Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14/2 heads, intermediate 4864, vocab
   151,936) and Qwen2.5-1.5B's (1536, 28, 12/2, 8960), bf16 autocast over float32
   master weights (``TrainerConfig.mixed_precision="bf16"`` without sharding), 16 rows
   x 1024 tokens; tokens/s and MFU = ``training_flops`` / (step time x the chip's dense
   bf16 peak). The warm-up step is not timed; gradient checkpointing is switched on
   (and the step rerun) only if the step runs out of memory without it.
2. ``rollout``: the embedded HF engine (rlkit decode loop) on the 0.5B model in bf16,
   64 and 256 sequences in flight, 128 new tokens, no stop token (every row runs to
   length); tokens/s of response tokens.
3. ``fused log-prob``: peak memory and time of ``token_logprobs_and_entropy``
   (forward + backward), the default fused kernel vs the naive one, at vocabulary
   151,936 and hidden 896 (float32 inputs). CUDA: ``max_memory_allocated`` growth in
   process; CPU: ``benchmarks/logprobs.py``'s subprocess RSS measurement.
4. ``remove padding``: ``ActorModule(remove_padding=True)`` vs ``False`` forward +
   backward on ragged rows (real lengths 1/4 to all of each half), timed alternately;
   the row names the attention implementation that ran (flash-attention 2 if
   installed, else SDPA) and the largest log-prob difference between the two, from one
   more forward of each in full float32 (the exactness claim; bf16 rounds by layout).
5. ``shared prefix``: ``ActorModule(share_prefix=True)`` vs ``False`` forward + backward
   on the remove-padding rows, every ``prefix_group`` of them given one prompt (as GRPO's
   n responses to a prompt), SDPA attention; timed alternately, with the largest log-prob
   difference between the two in full float32, as in 4.
6. ``fsdp2``: ``TrainingBackend(strategy="fsdp2", mixed_precision="bf16")`` in this
   single process, the 0.5B actor, 3 steps (forward, backward, clip, AdamW); step times
   and whether every loss is finite.
7. ``tensor parallel``: :mod:`benchmarks.tensor_parallel`'s three layouts (one process,
   FSDP2 over 2, t = 2 over 2), step time and memory per process; on CUDA it needs 2
   GPUs (one per process) and says so on a machine with one.
8. ``vllm rollout``: where vLLM is installed (``scripts/install_vllm.sh``, or
   ``RLKIT_VLLM_PYTHON``), the vLLM engine with one server on the rollout model of 2
   (bf16 on a GPU; on a CPU a tiny model with heads of 32, the smallest vLLM's CPU
   attention runs): tokens/s at each concurrency and the seconds of one weight sync.

``--tiny`` runs the same code paths at tiny sizes (the byte-tokenizer Qwen2 of
:mod:`rlkit.models.tiny`, a few rows of a few dozen tokens) in under a minute on a CPU;
the smoke test runs it. MFU is ``n/a`` where the chip's peak FLOP/s is unknown (a CPU).

    python benchmarks/gpu_check.py                       # one CUDA GPU, about 2-4 minutes
    python benchmarks/gpu_check.py --tiny --device cpu   # the smoke-test size
    bash benchmarks/gpu_check.sh                         # the wrapper: checks, budget, a copy

``--budget-s``: sections that would start after this many seconds are skipped (their
rows say so); SIGTERM (the wrapper's hard timeout) also ends the run with the table.
``--log PATH``: every progress line and row is also appended there as it comes, so a run
killed outright (no table printed) still leaves its rows.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import platform as host
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))
if str(_ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(_ROOT / "benchmarks"))

import torch  # noqa: E402
import transformers  # noqa: E402
from tiny_models import random_qwen2  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import rlkit.device  # noqa: E402
from rlkit.metrics.flops import training_flops  # noqa: E402
from rlkit.modeling.modules import ActorModule  # noqa: E402
from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer  # noqa: E402
from rlkit.ops import token_logprobs_and_entropy  # noqa: E402
from rlkit.rollout.base import SamplingParams  # noqa: E402
from rlkit.rollout.embedded.engine import HFEngine  # noqa: E402

transformers.utils.logging.disable_progress_bar()
# ActorModule returns slices of its outputs; nothing here modifies them in place.
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")

GIB = float(1 << 30)
SECTIONS = (
    "update step",
    "rollout",
    "fused log-prob",
    "remove padding",
    "shared prefix",
    "fsdp2",
    "tensor parallel",
    "vllm rollout",
)


# --------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class ModelShape:
    """A Qwen2 decoder shape; ``tiny`` ones are built by :func:`build_tiny_qwen2`."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 151936
    tiny: bool = False


QWEN_05B = ModelShape("0.5B", 896, 24, 14, 2, 4864)
QWEN_15B = ModelShape("1.5B", 1536, 28, 12, 2, 8960)
TINY_A = ModelShape("tiny 64x2", 64, 2, 4, 2, 128, vocab=0, tiny=True)
TINY_B = ModelShape("tiny 128x2", 128, 2, 4, 2, 256, vocab=0, tiny=True)
# Two heads of 32: the smallest head size vLLM's CPU attention implements.
TINY_V = ModelShape("tiny 64x2 (heads 2x32)", 64, 2, 2, 1, 128, vocab=0, tiny=True)


@dataclass(frozen=True)
class Sizes:
    """Every size the sections use; :data:`FULL` on a GPU, :data:`TINY` for ``--tiny``."""

    update_models: tuple[ModelShape, ...]
    update_rows: int
    update_prompt: int
    update_response: int
    update_steps: int
    rollout_model: ModelShape
    rollout_concurrency: tuple[int, ...]
    rollout_prompt: int
    rollout_new_tokens: int
    logprob_tokens: int
    logprob_hidden: int
    logprob_vocab: int
    rmpad_model: ModelShape
    rmpad_rows: int
    rmpad_prompt: int
    rmpad_response: int
    rmpad_rounds: int
    prefix_group: int
    fsdp_model: ModelShape
    fsdp_rows: int
    fsdp_prompt: int
    fsdp_response: int
    vllm_model: ModelShape = QWEN_05B
    fsdp_steps: int = 3


FULL = Sizes(
    update_models=(QWEN_05B, QWEN_15B),
    update_rows=16,
    update_prompt=256,
    update_response=768,
    update_steps=3,
    rollout_model=QWEN_05B,
    rollout_concurrency=(64, 256),
    rollout_prompt=64,
    rollout_new_tokens=128,
    logprob_tokens=8192,
    logprob_hidden=896,
    logprob_vocab=151936,
    rmpad_model=QWEN_05B,
    rmpad_rows=16,
    rmpad_prompt=512,
    rmpad_response=512,
    rmpad_rounds=3,
    prefix_group=8,
    fsdp_model=QWEN_05B,
    fsdp_rows=8,
    fsdp_prompt=256,
    fsdp_response=768,
)
TINY = Sizes(
    update_models=(TINY_A, TINY_B),
    update_rows=4,
    update_prompt=16,
    update_response=48,
    update_steps=2,
    rollout_model=TINY_A,
    rollout_concurrency=(4, 8),
    rollout_prompt=8,
    rollout_new_tokens=16,
    logprob_tokens=128,
    logprob_hidden=64,
    logprob_vocab=151936,
    rmpad_model=TINY_A,
    rmpad_rows=4,
    rmpad_prompt=16,
    rmpad_response=32,
    rmpad_rounds=2,
    prefix_group=2,
    fsdp_model=TINY_A,
    fsdp_rows=2,
    fsdp_prompt=8,
    fsdp_response=24,
    vllm_model=TINY_V,
)


# --------------------------------------------------------------------------- table
@dataclass
class Table:
    """The one output table: rows of (section, setting, metric, value, note)."""

    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    log_path: Path | None = None  # --log: progress lines also go there, as they come

    def add(self, section: str, setting: str, metric: str, value: str, note: str = "") -> None:
        """Append a row and echo it, so a killed run still shows its progress."""
        row = (section, setting, metric, value, note.replace("|", "/").replace("\n", " "))
        self.rows.append(row)
        self.progress("  " + " | ".join(row))

    def progress(self, line: str) -> None:
        """One progress line to stderr and, if set, appended to the log file."""
        print(line, file=sys.stderr, flush=True)
        if self.log_path is not None:
            with self.log_path.open("a") as log:
                log.write(line + "\n")

    def markdown(self) -> str:
        """The table as Markdown."""
        lines = ["| section | setting | metric | value | note |", "|---|---|---|---:|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


class Interrupted(Exception):
    """Raised by the SIGTERM handler: stop measuring, print what there is."""


@dataclass
class Context:
    """What every section reads: the device, precision, sizes, budget and the table."""

    device: torch.device
    autocast_dtype: torch.dtype | None
    sizes: Sizes
    table: Table
    budget_s: float
    start: float
    workdir: Path
    platform: Any

    @property
    def cuda(self) -> bool:
        """Whether the sections run on a CUDA device."""
        return self.device.type == "cuda"

    def autocast(self) -> Any:
        """bf16 autocast (float32 master weights), or nothing with ``--precision fp32``."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def sync(self) -> None:
        """Wait for queued device work (timings end here)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start

    def free(self) -> None:
        """Release memory between sections."""
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def peak_gib(self) -> str:
        """Peak allocated device memory since the last reset, for notes."""
        if not self.cuda:
            return ""
        return f"peak {torch.cuda.max_memory_allocated(self.device) / GIB:.1f} GiB"

    def reset_peak(self) -> None:
        """Start a new peak-memory window (CUDA only)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)


# --------------------------------------------------------------------------- helpers
def _byte_tokenizer() -> Any:
    """The locally trained byte tokenizer (cached: training it takes a moment)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = train_byte_tokenizer()
    return _TOKENIZER


_TOKENIZER: Any = None


def vocab_of(shape: ModelShape) -> int:
    """The vocabulary size of a shape (a tiny model's is its byte tokenizer's)."""
    return len(_byte_tokenizer()) if shape.tiny else shape.vocab


def flash_attention_available(ctx: Context) -> bool:
    """Whether flash-attention 2 can run here (installed, CUDA)."""
    return ctx.cuda and importlib.util.find_spec("flash_attn") is not None


def build_model(ctx: Context, shape: ModelShape, attn: str = "sdpa") -> torch.nn.Module:
    """A random float32 Qwen2 of ``shape`` on the context's device, in train mode.

    Tiny shapes go through :func:`build_tiny_qwen2` (saved, then loaded as any
    checkpoint); the large ones are initialised directly on the device (seconds on a
    GPU, where a host-side init of 1.5B parameters takes a minute).
    """
    if shape.tiny:
        path = ctx.workdir / shape.name.replace(" ", "_")
        if not path.exists():
            build_tiny_qwen2(
                path,
                _byte_tokenizer(),
                hidden_size=shape.hidden,
                num_layers=shape.layers,
                num_heads=shape.heads,
                num_kv_heads=shape.kv_heads,
                intermediate_size=shape.intermediate,
                max_position_embeddings=4096,
            )
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation=attn
        )
        model = model.to(ctx.device)
    else:
        model = random_qwen2(
            vocab_size=shape.vocab,
            hidden_size=shape.hidden,
            num_layers=shape.layers,
            num_heads=shape.heads,
            num_kv_heads=shape.kv_heads,
            intermediate_size=shape.intermediate,
            max_position_embeddings=32768,
            tie_word_embeddings=True,  # as Qwen2.5-0.5B and -1.5B
            device=ctx.device,
            attn_implementation=attn,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
        )
    model.config.use_cache = False
    return model.train()


def make_batch(
    ctx: Context,
    rows: int,
    prompt_width: int,
    response_width: int,
    vocab: int,
    ragged: bool = False,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A ``TrainBatch.model_inputs``-shaped batch: left-padded prompts, right-padded responses.

    ``ragged``: each row's real prompt and response lengths are drawn from a quarter of
    the width up to all of it (the first row keeps both full widths); else no padding.
    Ids avoid 0 (the pad id). Adds ``response_mask`` (real response tokens).
    """
    gen = torch.Generator().manual_seed(seed)
    width = prompt_width + response_width
    ids = torch.randint(1, vocab, (rows, width), generator=gen)
    mask = torch.ones(rows, width, dtype=torch.long)
    if ragged:
        for r in range(1, rows):
            p = int(torch.randint(max(1, prompt_width // 4), prompt_width + 1, (), generator=gen))
            t = int(
                torch.randint(max(1, response_width // 4), response_width + 1, (), generator=gen)
            )
            mask[r, : prompt_width - p] = 0
            mask[r, prompt_width + t :] = 0
    ids = ids.masked_fill(mask == 0, 0)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": position_ids,
        "responses": ids[:, prompt_width:].contiguous(),
        "response_mask": mask[:, prompt_width:].float(),
    }
    return {k: v.to(ctx.device) for k, v in batch.items()}


def actor_loss(
    actor: torch.nn.Module, batch: dict[str, torch.Tensor], prompt_width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A policy-gradient-shaped loss: masked mean of -log-prob minus an entropy bonus.

    Returns ``(loss, log_probs)``.
    """
    logp, ent = actor(batch, prompt_width)
    mask = batch["response_mask"]
    denom = mask.sum().clamp(min=1.0)
    loss = -(logp * mask).sum() / denom - 1e-3 * (ent * mask).sum() / denom
    return loss, logp


def fmt(x: float, digits: int = 3) -> str:
    """A number for the table: thousands separators for large values, else ``digits`` sig."""
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


@contextmanager
def timed_section(ctx: Context, name: str) -> Iterator[None]:
    """Run one section: its error becomes a row, its wall time a row; memory freed after."""
    start = time.perf_counter()
    ctx.table.progress(f"[{ctx.elapsed():6.1f}s] {name} ...")
    try:
        yield
    except Interrupted:
        raise
    except Exception as error:  # noqa: BLE001 - a failed section is reported, the run goes on
        _error_row(ctx, name, error)
    finally:
        try:
            ctx.free()
        except Exception as error:  # noqa: BLE001 - e.g. a CUDA error left by the section
            _error_row(ctx, name, error, "freeing memory: ")
    ctx.table.add(name, "total", "section wall s", f"{time.perf_counter() - start:.1f}")


def _error_row(ctx: Context, name: str, error: Exception, during: str = "") -> None:
    """Section ``name``'s error row: ``during``, then the exception's type and message."""
    note = during + f"{type(error).__name__}: {error}".strip()
    ctx.table.add(name, "-", "error", "ERROR", note[:300])


# --------------------------------------------------------------------------- sections
def section_update_step(ctx: Context) -> None:
    """1. Update step tokens/s and MFU for each update model."""
    s = ctx.sizes
    peak = ctx.platform.peak_flops(ctx.autocast_dtype or torch.float32)
    for shape in s.update_models:
        out_of_memory = False
        try:
            _update_step_row(ctx, shape, checkpointing=False, peak=peak)
        except torch.OutOfMemoryError:
            out_of_memory = True  # retried below, once the traceback's tensors are gone
        if out_of_memory:
            ctx.free()
            _update_step_row(ctx, shape, checkpointing=True, peak=peak)


def _update_step_row(
    ctx: Context, shape: ModelShape, checkpointing: bool, peak: float | None
) -> None:
    """Time ``update_steps`` steps after one warm-up step; add the tokens/s and MFU rows."""
    s = ctx.sizes
    model = build_model(ctx, shape)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    actor = ActorModule(model)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-6, fused=ctx.cuda)
    batch = make_batch(ctx, s.update_rows, s.update_prompt, s.update_response, vocab_of(shape))
    seq = s.update_prompt + s.update_response
    ctx.reset_peak()
    times = []
    for i in range(1 + s.update_steps):  # step 0 warms up allocator, kernels, optimizer state
        start = time.perf_counter()
        with ctx.autocast():
            loss, _ = actor_loss(actor, batch, s.update_prompt)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ctx.sync()
        if i > 0:
            times.append(time.perf_counter() - start)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"non-finite loss {loss.item()}")
    memory = ctx.peak_gib()
    step_s = statistics.median(times)
    tokens = s.update_rows * seq
    flops = training_flops(_config_of(shape), [seq] * s.update_rows)
    setting = f"{shape.name} ({_count(params)} params), {s.update_rows}x{seq}"
    note = ", ".join(
        x
        for x in (
            f"median of {len(times)} steps {step_s:.3f} s",
            "grad ckpt on (OOM without)" if checkpointing else "grad ckpt off",
            _precision_note(ctx),
            memory,
        )
        if x
    )
    ctx.table.add("update step", setting, "tokens/s", fmt(tokens / step_s), note)
    mfu = "n/a" if peak is None else f"{100 * flops / (step_s * peak):.1f}%"
    mfu_note = f"{_count(flops, 'G')}FLOP/step (verl count)"
    mfu_note += (
        ", peak FLOP/s unknown here" if peak is None else f", peak {peak / 1e12:.0f} TFLOP/s"
    )
    ctx.table.add("update step", setting, "MFU", mfu, mfu_note)


def _count(x: float, billion: str = "B") -> str:
    """``1.54B``, ``494M``, ``37.1k``: a count for the table (``billion="G"`` for FLOPs)."""
    for scale, suffix in ((1e12, "T"), (1e9, billion), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.0f}"


def _config_of(shape: ModelShape) -> types.SimpleNamespace:
    """The config fields ``training_flops`` reads."""
    return types.SimpleNamespace(
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        vocab_size=vocab_of(shape),
    )


def _precision_note(ctx: Context) -> str:
    if ctx.autocast_dtype is None:
        return "fp32"
    return "bf16 autocast, fp32 master"


class _LiveWeights:
    """The ``PolicyWeights`` an embedded engine reads: the model itself."""

    version = 0

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @contextmanager
    def generation_context(self) -> Iterator[tuple[torch.nn.Module, dict[str, Any]]]:
        """Yield the live model and no extra generate arguments."""
        yield self.model, {}


def section_rollout(ctx: Context) -> None:
    """2. Embedded-engine rollout tokens/s at each concurrency."""
    s = ctx.sizes
    shape = s.rollout_model
    model = build_model(ctx, shape).eval()
    model.config.use_cache = True
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    model = model.to(dtype)
    vocab = vocab_of(shape)
    gen = torch.Generator().manual_seed(1)
    try:
        for conc in s.rollout_concurrency:
            prompts = torch.randint(1, vocab, (conc, s.rollout_prompt), generator=gen).tolist()
            # No stop ids: random weights would sample EOS at random; every row runs to length.
            engine = HFEngine(
                _LiveWeights(model), pad_token_id=0, eos_token_ids=(), generation_batch_size=conc
            )
            engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, seed=0))  # warm-up
            ctx.reset_peak()
            ctx.sync()
            start = time.perf_counter()
            params = SamplingParams(max_new_tokens=s.rollout_new_tokens, temperature=1.0, seed=0)
            out = engine.generate(prompts, params)
            ctx.sync()
            elapsed = time.perf_counter() - start
            generated = sum(len(r) for r in out.response_ids)
            full = all(len(r) == s.rollout_new_tokens for r in out.response_ids)
            note = ", ".join(
                x
                for x in (
                    f"{conc} prompts x {s.rollout_new_tokens} new tokens in {elapsed:.2f} s",
                    "all rows ran to length" if full else "SOME ROWS STOPPED EARLY",
                    f"{str(dtype).removeprefix('torch.')} weights, rlkit decode loop, sdpa",
                    ctx.peak_gib(),
                )
                if x
            )
            ctx.table.add(
                "rollout",
                f"{shape.name}, {conc} concurrent seqs",
                "tokens/s",
                fmt(generated / elapsed),
                note,
            )
    finally:
        del model


def section_fused_logprob(ctx: Context) -> None:
    """3. Fused vs naive log-prob + entropy: peak memory and time, forward + backward."""
    s = ctx.sizes
    setting = f"vocab {s.logprob_vocab:,}, {s.logprob_tokens} tokens, hidden {s.logprob_hidden}"
    if ctx.cuda:
        fused = _cuda_logprob(ctx, None)
        naive = _cuda_logprob(ctx, "naive")
        how = "max_memory_allocated growth"
    else:
        fused, naive = _cpu_logprob(ctx)
        how = "peak RSS growth (benchmarks/logprobs.py worker)"
    ctx.table.add("fused log-prob", setting, "fused peak GiB", f"{fused[0] / GIB:.3f}", how)
    ctx.table.add("fused log-prob", setting, "naive peak GiB", f"{naive[0] / GIB:.3f}", how)
    ratio = fused[0] / naive[0] if naive[0] > 0 else float("nan")
    ctx.table.add(
        "fused log-prob",
        setting,
        "fused / naive memory",
        f"{ratio:.3f}",
        f"time fused {fused[1]:.3f} s, naive {naive[1]:.3f} s "
        f"(ratio {fused[1] / max(naive[1], 1e-9):.2f}); forward+backward, float32",
    )


def _cuda_logprob(ctx: Context, kernel: str | None) -> tuple[float, float]:
    """(peak bytes over the inputs, seconds) of one forward + backward (after a warm-up)."""
    s = ctx.sizes
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    kw = {"device": ctx.device, "generator": gen}
    hidden = torch.randn(s.logprob_tokens, s.logprob_hidden, **kw).requires_grad_()
    weight = (0.05 * torch.randn(s.logprob_vocab, s.logprob_hidden, **kw)).requires_grad_()
    labels = torch.randint(0, s.logprob_vocab, (s.logprob_tokens,), **kw)
    result = (0.0, 0.0)
    for _ in range(2):  # the first run warms up kernels and the allocator
        hidden.grad = weight.grad = None
        ctx.free()
        ctx.sync()
        base = torch.cuda.memory_allocated(ctx.device)
        ctx.reset_peak()
        start = time.perf_counter()
        lp, ent = token_logprobs_and_entropy(hidden, weight, labels, kernel=kernel)
        (lp.sum() + ent.sum()).backward()
        ctx.sync()
        seconds = time.perf_counter() - start
        result = (float(torch.cuda.max_memory_allocated(ctx.device) - base), seconds)
        del lp, ent
    del hidden, weight, labels
    return result


def _cpu_logprob(ctx: Context) -> tuple[tuple[float, float], tuple[float, float]]:
    """Both variants through ``benchmarks/logprobs.py``'s fresh-subprocess measurement."""
    spec = importlib.util.spec_from_file_location(
        "benchmark_logprobs", Path(__file__).with_name("logprobs.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    s = ctx.sizes
    args = argparse.Namespace(
        repeats=1, tokens=s.logprob_tokens, vocab=s.logprob_vocab, hidden=s.logprob_hidden
    )
    if ctx.sizes is TINY:
        # Smoke-test size: both fresh processes at once (each pays torch's import); the
        # peaks are per process, only the times feel the sharing.
        with ThreadPoolExecutor(2) as pool:
            fused_job = pool.submit(module._run_variant, args, "chunked", 1024)
            naive = module._run_variant(args, "naive", 1024)
            fused = fused_job.result()
    else:
        fused = module._run_variant(args, "chunked", 1024)
        naive = module._run_variant(args, "naive", 1024)
    return (float(fused["peak"]), min(fused["times"])), (float(naive["peak"]), min(naive["times"]))


def _alternate(
    ctx: Context, actor: ActorModule, batch: dict, prompt_width: int, switch: str, rounds: int
) -> tuple[float, float]:
    """Forward + backward with ``actor.<switch>`` off and on, alternately (round 0 warms
    both up); returns (median s off, median s on)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(rounds + 1):
        for on in (False, True):
            setattr(actor, switch, on)
            ctx.sync()
            start = time.perf_counter()
            with ctx.autocast():
                loss, _ = actor_loss(actor, batch, prompt_width)
            loss.backward()
            ctx.sync()
            if round_ > 0:
                times[on].append(time.perf_counter() - start)
            actor.zero_grad(set_to_none=True)
    return statistics.median(times[False]), statistics.median(times[True])


def _float32_logp_difference(
    actor: ActorModule, batch: dict, prompt_width: int, switch: str
) -> float:
    """The largest response log-prob difference between ``actor.<switch>`` off and on, in
    full float32 (no autocast, no TF32).

    The exactness claim is a float32 one: under bf16 the two layouts' products round
    differently wherever the kernel blocks rows differently (CPUs with native bf16 products
    do), so a bf16 difference measures rounding, not the switch.
    """
    logps = {}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            for on in (False, True):
                setattr(actor, switch, on)
                logps[on] = actor(batch, prompt_width)[0]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    mask = batch["response_mask"].bool()
    return (logps[True] - logps[False]).abs()[mask].max().item()


def section_remove_padding(ctx: Context) -> None:
    """4. Remove-padding speedup on ragged rows (forward + backward, no optimizer)."""
    s = ctx.sizes
    shape = s.rmpad_model
    attn = "flash_attention_2" if flash_attention_available(ctx) else "sdpa"
    model = build_model(ctx, shape, attn=attn)
    actor = ActorModule(model)
    batch = make_batch(
        ctx, s.rmpad_rows, s.rmpad_prompt, s.rmpad_response, vocab_of(shape), ragged=True
    )
    real = int(batch["attention_mask"].sum())
    total = batch["attention_mask"].numel()
    try:
        padded, packed = _alternate(
            ctx, actor, batch, s.rmpad_prompt, "remove_padding", s.rmpad_rounds
        )
        check = ""
        if attn != "sdpa":  # flash-attention 2 runs in bf16 / fp16 only
            model.set_attn_implementation("sdpa")
            check = "float32 check under sdpa: "
        diff = _float32_logp_difference(actor, batch, s.rmpad_prompt, "remove_padding")
    finally:
        del actor, model
    setting = f"{shape.name}, {s.rmpad_rows} rows x {s.rmpad_prompt}+{s.rmpad_response}"
    ctx.table.add(
        "remove padding",
        setting,
        "speedup (padded / packed)",
        f"{padded / packed:.2f}x",
        f"attention {attn}; {real}/{total} real tokens; padded {padded:.3f} s, packed "
        f"{packed:.3f} s (median of {s.rmpad_rounds}); {check}max abs logp diff {diff:.2e} "
        "(float32)",
    )


def share_prompts(batch: dict[str, torch.Tensor], prompt_width: int, group: int) -> None:
    """Give each run of ``group`` rows its first row's prompt (ids and padding), in place."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    for first in range(0, ids.shape[0], group):
        ids[first : first + group, :prompt_width] = ids[first, :prompt_width]
        mask[first : first + group, :prompt_width] = mask[first, :prompt_width]
    batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)


def section_shared_prefix(ctx: Context) -> None:
    """5. Shared-prefix speedup: each prompt once for its group (forward + backward)."""
    s = ctx.sizes
    shape = s.rmpad_model
    model = build_model(ctx, shape, attn="sdpa")  # a custom 4D mask: not flash-attention
    actor = ActorModule(model)
    batch = make_batch(
        ctx, s.rmpad_rows, s.rmpad_prompt, s.rmpad_response, vocab_of(shape), ragged=True
    )
    share_prompts(batch, s.rmpad_prompt, s.prefix_group)
    try:
        plain, shared = _alternate(
            ctx, actor, batch, s.rmpad_prompt, "share_prefix", s.rmpad_rounds
        )
        diff = _float32_logp_difference(actor, batch, s.rmpad_prompt, "share_prefix")
    finally:
        del actor, model
    groups = s.rmpad_rows // s.prefix_group
    setting = (
        f"{shape.name}, {groups} prompts x {s.prefix_group} responses, "
        f"{s.rmpad_prompt}+{s.rmpad_response}"
    )
    ctx.table.add(
        "shared prefix",
        setting,
        "speedup (plain / shared)",
        f"{plain / shared:.2f}x",
        f"attention sdpa; plain {plain:.3f} s, shared {shared:.3f} s (median of "
        f"{s.rmpad_rounds}); max abs logp diff {diff:.2e} (float32)",
    )


def section_fsdp2(ctx: Context) -> None:
    """6. A few FSDP2 training steps in this one process."""
    from rlkit.trainer.backend import TrainingBackend

    s = ctx.sizes
    shape = s.fsdp_model
    mixed = "bf16" if ctx.autocast_dtype is not None else "no"
    backend = TrainingBackend(strategy="fsdp2", mixed_precision=mixed, seed=0)
    try:
        model = build_model(ctx, shape)
        actor, optimizer = backend.prepare(
            ActorModule(model), lambda ps: torch.optim.AdamW(ps, lr=1e-6)
        )
        batch = make_batch(ctx, s.fsdp_rows, s.fsdp_prompt, s.fsdp_response, vocab_of(shape))
        ctx.reset_peak()
        times, losses, norms = [], [], []
        for _ in range(s.fsdp_steps):
            start = time.perf_counter()
            loss, _ = actor_loss(actor, batch, s.fsdp_prompt)
            backend.backward(loss)
            norms.append(float(backend.clip_grad_norm_(actor, 1.0)))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ctx.sync()
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
        sharded, nprocs = backend.is_sharded, backend.num_processes
        memory = ctx.peak_gib()
        del actor, optimizer, model
    finally:
        backend.close()
    finite = all(math.isfinite(x) for x in losses + norms)
    setting = f"{shape.name}, {s.fsdp_rows}x{s.fsdp_prompt + s.fsdp_response}, 1 process"
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    ctx.table.add(
        "fsdp2",
        setting,
        "step s (after the first)",
        f"{steady:.3f}",
        ", ".join(
            x
            for x in (
                "steps " + ", ".join(f"{t:.3f}" for t in times),
                f"sharded={sharded}, processes={nprocs}, mixed_precision={mixed}",
                memory,
            )
            if x
        ),
    )
    ctx.table.add(
        "fsdp2",
        setting,
        "loss finite",
        "yes" if finite else "NO",
        "losses " + ", ".join(f"{x:.4f}" for x in losses),
    )


def section_tensor_parallel(ctx: Context) -> None:
    """7. ``benchmarks/tensor_parallel.py``: t = 2 against FSDP2 and one process, each
    layout its own job (CUDA: one GPU per process, NCCL; so 2 GPUs are needed)."""
    gpus = torch.cuda.device_count() if ctx.cuda else 0
    if ctx.cuda and gpus < 2:
        ctx.table.add(
            "tensor parallel",
            "t = 2",
            "not run",
            "needs 2 GPUs",
            f"this machine has {gpus}; the CPU table: python benchmarks/tensor_parallel.py",
        )
        return
    shape = ["--hidden-size", "128", "--layers", "1", "--heads", "4", "--kv-heads", "2"]
    shape += ["--vocab", "512", "--tokens", "32", "--repeats", "1"]
    shape += ["--layouts", "one,tp"]  # the smoke size: two jobs
    if ctx.cuda:
        shape = ["--hidden-size", "896", "--layers", "4", "--heads", "14", "--kv-heads", "2"]
        shape += ["--vocab", "151936", "--rows", "16", "--tokens", "1024", "--device", "cuda"]
    out = ctx.workdir / "tensor_parallel.json"
    script = Path(__file__).resolve().parent / "tensor_parallel.py"
    proc = subprocess.run(
        [sys.executable, str(script), *shape, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=max(60.0, ctx.budget_s - ctx.elapsed()),
    )
    if proc.returncode:
        raise RuntimeError(proc.stdout[-1000:] + proc.stderr[-2000:])
    rows = json.loads(out.read_text())
    mib = 2.0**20
    for row in rows:
        ctx.table.add(
            "tensor parallel",
            row["layout"],
            "step s",
            f"{row['step_s']:.3f}",
            f"{row['step_s'] / rows[0]['step_s']:.2f}x the 1-process step; parameters "
            f"{row['params'] / mib:.1f} MiB, AdamW {row['optimizer'] / mib:.1f} MiB, "
            f"activations {row['activations'] / mib:.1f} MiB per process",
        )


def section_vllm_rollout(ctx: Context) -> None:
    """7. The vLLM engine (one server of vLLM's own environment) on the rollout sizes:
    tokens/s at each concurrency and the seconds of one weight sync (reload from disk)."""
    from rlkit.rollout.servers.errors import ServerStartError
    from rlkit.rollout.vllm.server import check_vllm_install, find_vllm_python

    try:
        version = check_vllm_install(find_vllm_python())
    except ServerStartError as exc:
        ctx.table.add("vllm rollout", "-", "n/a", "-", f"not measured: {exc}")
        return
    import rlkit.rollout  # noqa: F401  (registers "vllm")
    from rlkit.registry import ROLLOUT_ENGINES

    s = ctx.sizes
    shape = s.vllm_model
    model = build_model(ctx, shape).eval()
    path = ctx.workdir / "vllm_model"
    model.save_pretrained(path)
    _byte_tokenizer().save_pretrained(path)
    if ctx.cuda:
        torch.cuda.empty_cache()  # the server allocates its share of what is free
    options = (
        {"device": "cuda", "dtype": "bfloat16", "gpu_memory_utilization": 0.5}
        if ctx.cuda
        else {"device": "cpu", "dtype": "float32", "server_args": ["--enforce-eager"]}
    )
    engine = ROLLOUT_ENGINES.get("vllm")(
        model_path=str(path),
        num_servers=1,
        log_dir=str(ctx.workdir / "vllm_logs"),
        verify_tolerance=float("inf"),
        **options,
    )
    # Byte-token prompts (ids 3..258): ids the saved tokenizer can also print.
    gen = torch.Generator().manual_seed(2)
    try:
        for conc in s.rollout_concurrency:
            engine.max_concurrency = conc
            prompts = torch.randint(3, 259, (conc, s.rollout_prompt), generator=gen).tolist()
            engine.generate(prompts[:2], SamplingParams(max_new_tokens=4))  # warm-up
            params = SamplingParams(max_new_tokens=s.rollout_new_tokens, temperature=1.0)
            start = time.perf_counter()
            out = engine.generate(prompts, params)
            elapsed = time.perf_counter() - start
            generated = sum(len(r) for r in out.response_ids)
            note = (
                f"{conc} prompts x up to {s.rollout_new_tokens} new tokens in {elapsed:.2f} s, "
                f"vLLM {version}, {options['dtype']}"
            )
            ctx.table.add(
                "vllm rollout",
                f"{shape.name}, {conc} concurrent seqs",
                "tokens/s",
                fmt(generated / elapsed),
                note,
            )
        from rlkit.trainer.policy_weights import FrozenPolicyWeights

        metrics = engine.sync_weights(FrozenPolicyWeights(model, None, 1))
        ctx.table.add(
            "vllm rollout",
            shape.name,
            "weight sync s",
            fmt(metrics["timing_s/weight_sync"]),
            f"snapshot + reload from disk; log-prob diff after it "
            f"{metrics['weight_sync/logprob_max_abs_diff']:.2g}",
        )
    finally:
        engine.close()
        del model


SECTION_FUNCTIONS: dict[str, Callable[[Context], None]] = {
    "update step": section_update_step,
    "rollout": section_rollout,
    "fused log-prob": section_fused_logprob,
    "remove padding": section_remove_padding,
    "shared prefix": section_shared_prefix,
    "fsdp2": section_fsdp2,
    "tensor parallel": section_tensor_parallel,
    "vllm rollout": section_vllm_rollout,
}


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny sizes (CPU smoke test)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if any")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip sections after this")
    p.add_argument("--log", type=Path, default=None, help="also append progress lines here")
    p.add_argument(
        "--precision", choices=("bf16", "fp32"), default="bf16", help="autocast dtype (bf16)"
    )
    p.add_argument(
        "--sections", default=",".join(SECTIONS), help="comma-separated subset, in this order"
    )
    return p.parse_args(argv)


def _header(ctx: Context, args: argparse.Namespace) -> str:
    name = ctx.platform.device_name(0) if ctx.cuda else (host.processor() or host.machine())
    return (
        f"gpu_check: {'tiny' if args.tiny else 'full'} sizes on {ctx.device} ({name}); "
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} CPU threads; precision {args.precision}; "
        f"budget {args.budget_s:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the sections and print the table; 0 when no section errored."""
    args = parse_args(argv)
    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_name == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    chosen = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        print(f"gpu_check: unknown sections {unknown}; known: {SECTIONS}", file=sys.stderr)
        return 2
    platform = rlkit.device.set_platform(device_name)
    device = platform.device(0) if device_name == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    table = Table(log_path=args.log)

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
            ctx = Context(
                device=device,
                autocast_dtype=torch.bfloat16 if args.precision == "bf16" else None,
                sizes=TINY if args.tiny else FULL,
                table=table,
                budget_s=args.budget_s,
                start=time.perf_counter(),
                workdir=Path(tmp),
                platform=platform,
            )
            header = _header(ctx, args)
            table.progress(header)
            pending = [name for name in SECTIONS if name in chosen]
            try:
                while pending:
                    name = pending[0]
                    if ctx.elapsed() > ctx.budget_s:
                        break
                    with timed_section(ctx, name):
                        SECTION_FUNCTIONS[name](ctx)
                    pending.pop(0)  # only now: an interrupted section is reported below
                reasons = [f"not started: over the {ctx.budget_s:.0f} s budget"] * len(pending)
            except Interrupted as stop:
                reasons = [f"interrupted while running ({stop})"]
                reasons += [f"not started: interrupted ({stop})"] * (len(pending) - 1)
            for name, reason in zip(pending, reasons, strict=True):
                table.add(name, "-", "skipped", "SKIPPED", reason)
            total = ctx.elapsed()
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(header)
    print()
    print(table.markdown())
    print()
    errors = [row[0] for row in table.rows if row[2] == "error"]
    skipped = [row[0] for row in table.rows if row[2] == "skipped"]
    print(f"total {total:.1f} s; errors: {', '.join(errors) or 'none'}", end="")
    print(f"; skipped: {', '.join(skipped)}" if skipped else "")
    return 1 if errors or skipped else 0


if __name__ == "__main__":
    sys.exit(main())

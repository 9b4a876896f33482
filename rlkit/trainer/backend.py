"""The training backend: the only place where the trainer meets Accelerate and FSDP2.

One process runs the model as a plain module; ``accelerate launch`` with several processes
shards it with FSDP2 (``torch.distributed.fsdp.fully_shard``) through Accelerate's own
``Accelerator.prepare`` path. On CPU-only machines a small shim
(:mod:`rlkit.trainer.fsdp_cpu_shim`) makes Accelerate pick FSDP2 over gloo, which it
otherwise refuses to do; on CUDA/NPU the shim does nothing. See ``docs/distributed.md``.

Gradient semantics: FSDP2 (like DDP) AVERAGES gradients over processes. A trainer that
normalises each process's loss by the GLOBAL normaliser (e.g. the token count of the whole
global batch) and multiplies it by ``num_processes`` gets, after ``backward``, exactly the
gradient of the global-batch loss::

    loss_r = num_processes * sum_{tokens on r} l / N_global
    mean_r grad(loss_r) = grad(sum_{all tokens} l / N_global)

Tensor parallelism (``tensor_parallel_size`` t > 1, :mod:`rlkit.distributed.tensor_parallel`):
the processes form a ``dp x tp`` mesh; each model is split by its family's plan over the
``tp`` axis and FSDP2 shards it over the ``dp`` axis only, so FSDP2 averages over the
``dp`` groups and the scale is their number (:attr:`TrainingBackend.gradient_scale`):
the ``t`` processes of a group compute the same loss from the same rows, each the
gradient of its own shards.

Sharded models: parameters are ``DTensor`` shards; ``full_state_dict`` gathers them,
``save_sharded`` / ``load_sharded`` write and read one shard per process
(``torch.distributed.checkpoint``), and ``generation_context`` makes
``model.backbone.generate`` usable.
"""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import (
    FullyShardedDataParallelPlugin,
    fsdp2_apply_ac,
    fsdp2_prepare_model,
    set_seed,
)
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from rlkit.distributed.sequence_parallel import (
    SequenceParallel,
    SequenceParallelError,
    build_sequence_parallel,
    sequence_parallel_problem,
)
from rlkit.distributed.tensor_parallel import (
    TensorParallel,
    TensorParallelError,
    build_tensor_parallel,
    combined_parallelism_problem,
    parallelize_backbone,
    process_count_problem,
)
from rlkit.trainer.fsdp_cpu_shim import enable_fsdp_on_cpu, has_accelerator
from rlkit.trainer.fsdp_units import shard_layers_and_root
from rlkit.trainer.grad_norm import clip_grad_norm
from rlkit.trainer.launch_env import (
    choose_sharding,
    launched,
    launched_world_size,
    restore_env,
    single_process_launch_env,
    warn_if_single_process_launch,
)

STRATEGIES = ("auto", "fsdp2", "none")
MIXED_PRECISIONS = ("no", "bf16", "fp16")


def _backbone_of(model: nn.Module) -> nn.Module:
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        raise TypeError(
            f"{type(model).__name__} has no nn.Module at `.backbone`; the backend prepares rlkit "
            "wrappers (e.g. ActorModule) that hold the Hugging Face model at `.backbone`."
        )
    return backbone


def _layer_class_names(backbone: nn.Module) -> list[str]:
    names = list(getattr(backbone, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(
            f"{type(backbone).__name__} lists no decoder-layer classes in `_no_split_modules`, so "
            "FSDP2 cannot wrap its layers; use a Hugging Face PreTrainedModel that sets it "
            "(all decoder LMs do) or strategy='none' with one process."
        )
    return names


def _plain_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    # accelerate's AcceleratedOptimizer wraps the real one at `.optimizer`.
    return getattr(optimizer, "optimizer", optimizer)


class TrainingBackend:
    """Accelerate-managed training backend: plain module, or FSDP2 across processes.

    Build exactly one per process (Accelerate's state is process-wide); :meth:`close`
    releases it so a new one can be built.

    Args:
        strategy: ``"auto"`` shards with FSDP2 when there is more than one process (or the run
            was launched with ``accelerate launch --use_fsdp``) and uses the plain module
            otherwise; ``"fsdp2"`` always shards, also with a single process (a one-process
            group is then created and destroyed by :meth:`close`); ``"none"`` never shards
            and requires a single process.
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``. Under FSDP2 it becomes the
            plugin's ``MixedPrecisionPolicy`` (parameters kept in fp32, computed in the low
            precision); without sharding accelerate autocasts the forward.
        reshard_after_forward: FSDP2: free the gathered decoder-layer parameters after each
            forward (``True``, less memory) or keep them until backward (``False``, fewer
            all-gathers).
        cpu_offload: FSDP2: keep sharded parameters, gradients and optimizer state in host
            memory (``CPUOffloadPolicy``). Needs an accelerator and sharding.
        activation_checkpointing: recompute each decoder layer in backward. FSDP2: accelerate's
            ``checkpoint_wrapper`` on the layers; plain: Hugging Face gradient checkpointing.
        seed: if given, seeds Python, NumPy and torch identically on every process.
        sequence_parallel_size: ``k`` processes split each sequence (Ulysses,
            :mod:`rlkit.modeling.ulysses`); FSDP2 still shards over all processes.
        tensor_parallel_size: ``t`` processes split every layer (module docstring); FSDP2
            shards over the ``processes / t`` data-parallel groups.

    Attributes:
        accelerator: the underlying ``accelerate.Accelerator``.
        device: the device this process computes on.
        process_index: this process's global rank.
        num_processes: number of processes.
        is_main_process: ``process_index == 0``.
        is_sharded: ``True`` when FSDP2 is in use.
        sequence_parallel: this process's place in the data-parallel x sequence-parallel
            grid (:class:`~rlkit.distributed.sequence_parallel.SequenceParallel`).
        tensor_parallel: this process's place in the data-parallel x tensor-parallel mesh
            (:class:`~rlkit.distributed.tensor_parallel.TensorParallel`).
    """

    def __init__(
        self,
        *,
        strategy: str = "auto",
        mixed_precision: str = "no",
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        activation_checkpointing: bool = False,
        seed: int | None = None,
        sequence_parallel_size: int = 1,
        tensor_parallel_size: int = 1,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}")
        if mixed_precision not in MIXED_PRECISIONS:
            raise ValueError(
                f"unknown mixed_precision {mixed_precision!r}; choose one of {MIXED_PRECISIONS}"
            )
        # Decided from the launcher's environment, before any process group exists, so a
        # refused configuration leaves nothing to tear down (re-creating a destroyed gloo
        # group inside one torchrun job is unreliable).
        cpu = not has_accelerator()
        launched_with_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
        sharded = choose_sharding(strategy, launched_world_size(), launched_with_fsdp)
        if cpu_offload and (cpu or not sharded):
            raise ValueError(
                "cpu_offload=True moves FSDP2 shards from an accelerator to host memory; it needs "
                f"an accelerator and sharding (accelerator found: {not cpu}, sharded: {sharded}). "
                "Set cpu_offload=False (TrainerConfig.cpu_offload); on an accelerator with one "
                "process, shard with strategy='fsdp2' (TrainerConfig.backend_strategy)."
            )
        warn_if_single_process_launch()
        problem = sequence_parallel_problem(sequence_parallel_size, launched_world_size())
        if problem:  # before any process group or model exists
            raise SequenceParallelError(problem)
        problem = process_count_problem(tensor_parallel_size, launched_world_size())
        problem = problem or combined_parallelism_problem(
            tensor_parallel_size, sequence_parallel_size
        )
        if problem:
            raise TensorParallelError(problem)
        self._closed = False
        self._owns_process_group = not dist.is_initialized()
        self._saved_use_fsdp = os.environ.get("ACCELERATE_USE_FSDP")
        force_group = sharded and not launched() and not dist.is_initialized()
        self._saved_launch_env = single_process_launch_env() if force_group else {}
        plugin = None
        if sharded:
            plugin = FullyShardedDataParallelPlugin(
                fsdp_version=2,
                reshard_after_forward=reshard_after_forward,
                cpu_offload=cpu_offload,
                activation_checkpointing=activation_checkpointing,
                auto_wrap_policy="transformer_based_wrap",
                state_dict_type="SHARDED_STATE_DICT",
            )
        # cpu=True when there is no accelerator: otherwise a torchrun-launched process on a
        # CPU-only machine is a lone process (DistributedType.NO); with it, accelerate uses gloo.
        self.accelerator = Accelerator(cpu=cpu, mixed_precision=mixed_precision, fsdp_plugin=plugin)
        if plugin is not None:
            enable_fsdp_on_cpu(self.accelerator, plugin)
            if not self.accelerator.is_fsdp2:
                raise RuntimeError(
                    "accelerate did not select FSDP2 (distributed type "
                    f"{self.accelerator.distributed_type}); please report this with your "
                    "accelerate version and launch command."
                )
        self.is_sharded = sharded
        self.activation_checkpointing = activation_checkpointing
        self.reshard_after_forward = reshard_after_forward
        self.device: torch.device = self.accelerator.device
        self.process_index: int = self.accelerator.process_index
        self.num_processes: int = self.accelerator.num_processes
        self.is_main_process: bool = self.accelerator.is_main_process
        self.sequence_parallel: SequenceParallel = build_sequence_parallel(sequence_parallel_size)
        self.tensor_parallel: TensorParallel = build_tensor_parallel(
            tensor_parallel_size, self.device.type
        )
        if seed is not None:
            set_seed(seed)

    @property
    def data_parallel(self) -> tuple[int, int]:
        """``(rank, size)`` of this process's data-parallel group: the processes of one
        Ulysses or tensor-parallel group hold the same rows."""
        grid = self.tensor_parallel if self.tensor_parallel.enabled else self.sequence_parallel
        return grid.dp_rank, grid.dp_size

    @property
    def row_replicas(self) -> int:
        """How many processes hold each row (a Ulysses or tensor-parallel group's size)."""
        return self.sequence_parallel.size * self.tensor_parallel.size

    @property
    def gradient_scale(self) -> int:
        """The factor of a process's globally normalised loss (module docstring): the
        processes FSDP2 averages gradients over."""
        return self.data_parallel[1] if self.tensor_parallel.enabled else self.num_processes

    # ------------------------------------------------------------------ models
    def prepare(
        self,
        model: nn.Module,
        optimizer_factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
    ) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """Place (and under FSDP2 shard) a wrapper model and build its optimizer.

        Under FSDP2 each decoder layer (classes in ``model.backbone._no_split_modules``) is
        one FSDP unit and the wrapper is the root unit: the root owns the embeddings, final
        norm and LM head, and gathers them in its pre-forward hook, so a wrapper forward that
        reads ``backbone.lm_head.weight`` directly (bypassing ``lm_head.forward``) sees the
        full matrix. Tied embeddings stay one parameter in the root unit. A frozen model's
        root is resharded after each forward (with ``reshard_after_forward``), a trained
        model's root stays gathered from forward to backward (FSDP2's default for roots).

        Args:
            model: rlkit wrapper ``nn.Module`` holding a Hugging Face ``PreTrainedModel`` at
                ``.backbone``. Sharded in place.
            optimizer_factory: builds the optimizer from the trainable parameters (those with
                ``requires_grad``); ``None`` for frozen models (e.g. the reference policy).

        Returns:
            ``(model, optimizer)``: the prepared model (the same object under FSDP2), and the
            optimizer wrapped by accelerate, or ``None`` without a factory.
        """
        backbone = _backbone_of(model)
        if self.tensor_parallel.enabled:
            return self._prepare_tensor_parallel(model, optimizer_factory)
        if self.is_sharded:
            self.accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap = _layer_class_names(
                backbone
            )
            if optimizer_factory is None:
                # Accelerator.prepare demands an optimizer under FSDP2 (to remap its
                # parameters); a frozen model has none, so call the function it would call.
                model = fsdp2_prepare_model(self.accelerator, model)
                # The root otherwise keeps embeddings and LM head gathered after forward,
                # waiting for a backward that a frozen model never runs.
                model.set_reshard_after_forward(self.reshard_after_forward, recurse=False)
                return model, None
        elif self.activation_checkpointing and optimizer_factory is not None:
            backbone.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if optimizer_factory is None:
            return self.accelerator.prepare(model), None
        optimizer = optimizer_factory([p for p in model.parameters() if p.requires_grad])
        model, optimizer = self.accelerator.prepare(model, optimizer)
        return model, optimizer

    def _prepare_tensor_parallel(
        self,
        model: nn.Module,
        optimizer_factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None,
    ) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """Split the backbone over the ``tp`` axis, then FSDP2 over the ``dp`` axis.

        Accelerate's own tensor-parallel preparation expects a model split by
        transformers' loader, so FSDP2 is applied here with the plugin's settings: one
        unit per decoder layer and the wrapper as root, as :meth:`prepare` gets them.
        """
        backbone = _backbone_of(model)
        parallelize_backbone(backbone, self.tensor_parallel)
        plugin = self.accelerator.state.fsdp_plugin
        plugin.transformer_cls_names_to_wrap = _layer_class_names(backbone)
        if self.activation_checkpointing:
            model = fsdp2_apply_ac(self.accelerator, model)
        shard_layers_and_root(
            model,
            self.tensor_parallel.mesh["dp"],
            plugin,
            upcast=self.accelerator.mixed_precision != "no",
            reshard_after_forward=self.reshard_after_forward,
        )
        if optimizer_factory is None:
            model.set_reshard_after_forward(self.reshard_after_forward, recurse=False)
            return model, None
        optimizer = optimizer_factory([p for p in model.parameters() if p.requires_grad])
        return model, self.accelerator.prepare_optimizer(optimizer)

    def unwrap(self, model: nn.Module) -> nn.Module:
        """Return the wrapper module itself (under FSDP2 the same object, still sharded).

        Args:
            model: a model returned by :meth:`prepare`.

        Returns:
            The model without accelerate's wrappers.
        """
        return self.accelerator.unwrap_model(model)

    # ---------------------------------------------------------------- training
    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss``; under FSDP2 gradients are then AVERAGED over processes
        (over the data-parallel axis with tensor parallelism).

        Args:
            loss: scalar loss of this process. For global-batch semantics normalise it by the
                global normaliser and multiply it by :attr:`gradient_scale` (module docstring).
        """
        self.accelerator.backward(loss)

    def clip_grad_norm_(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip gradients in place to a global L2 norm of at most ``max_norm``.

        Args:
            model: a prepared model whose gradients are clipped (DTensor or plain).
            max_norm: largest allowed total norm.

        Returns:
            Scalar tensor: the total gradient L2 norm before clipping, over all parameters of
            all processes (identical on every process); ``inf``/``nan`` are returned as is.
        """
        # Not accelerator.clip_grad_norm_: under FSDP it compares parameter lists with `==`,
        # which raises once two prepared models have equally many parameters (actor and
        # reference policy).
        self.accelerator.unscale_gradients()
        return clip_grad_norm([p for p in model.parameters() if p.grad is not None], max_norm)

    # ------------------------------------------------------------ collectives
    def barrier(self) -> None:
        """Wait until every process reaches this point."""
        self.accelerator.wait_for_everyone()

    # -------------------------------------------------------------- generation
    @contextmanager
    def generation_context(self, model: nn.Module) -> Iterator[dict[str, Any]]:
        """Make ``model.backbone.generate(...)`` work on a (possibly sharded) model.

        Under FSDP2 the root unit (embeddings, final norm, LM head) is gathered for the
        duration, because ``generate`` calls the backbone and never enters the root's forward
        hook; decoder layers gather and free themselves in their own hooks at every step.
        ``synced_gpus=True`` keeps every process stepping until all have finished, since a
        process that stopped early would leave the others waiting in an all-gather.

        Generation computes in the mixed-precision dtype, as the training forwards do: under
        FSDP2 the layers' ``MixedPrecisionPolicy`` casts the gathered parameters; unsharded,
        the whole context is one autocast region. Autocast caches the low-precision copy of
        each float32 parameter until the region ends, so each weight is cast once per
        rollout, not at every decoded token (as an autocast entered per ``forward`` would).

        Args:
            model: a model returned by :meth:`prepare`.

        Yields:
            Extra keyword arguments for ``generate``: ``{"synced_gpus": True}`` when sharded
            over several processes, else ``{}``.
        """
        if not self.is_sharded:
            with self.accelerator.autocast():
                yield {}
            return
        # The root must be lazily initialised before any layer runs on its own; otherwise
        # the first layer to run would claim to be the root (torch raises on the next
        # wrapper forward). No-op once the wrapper has run a forward.
        model._get_fsdp_state()._lazy_init()
        model.unshard()
        try:
            yield {"synced_gpus": True} if self.num_processes > 1 else {}
        finally:
            model.reshard()

    # ---------------------------------------------------------- checkpointing
    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Gather the full (unsharded) state dict. Collective: every process must call it.

        Uses ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` (FSDP1's
        full-state-dict gather crashes on CPU). Tied parameters appear under every name
        ``model.state_dict()`` gives them.

        Args:
            model: a model returned by :meth:`prepare`.

        Returns:
            ``{name: CPU tensor}`` with the wrapper's keys (e.g. ``"backbone.model.norm.weight"``)
            on the main process; under FSDP2 other processes get ``{}``. The tensors are a
            snapshot: later training steps do not change them.
        """
        if self.is_sharded:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            state = get_model_state_dict(model, options=options)
        else:
            state = {k: v.detach().cpu() for k, v in self.unwrap(model).state_dict().items()}
        return _without_aliases(state, model)

    def save_sharded(
        self, directory: str, model: nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> None:
        """Write model and optimizer state, one shard per process. Collective.

        Format: ``torch.distributed.checkpoint`` (``.metadata`` + ``__<rank>_0.distcp``),
        also with one unsharded process. :meth:`load_sharded` reads it into any number of
        processes, sharded or not (DCP reshards; tests/distributed/test_resume_resharding.py),
        and ``rlkit export`` into one plain process without a process group.

        Args:
            directory: an EXISTING directory (shared by all processes).
            model: a model returned by :meth:`prepare`.
            optimizer: its optimizer, or ``None`` to save the model only.
        """
        if not Path(directory).is_dir():
            raise FileNotFoundError(
                f"checkpoint directory {directory!r} does not exist; create it before save_sharded"
            )
        with _quiet_without_process_group():
            dcp.save(self._checkpoint_state(model, optimizer), checkpoint_id=directory)

    def load_sharded(
        self, directory: str, model: nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> None:
        """Load model and optimizer state written by :meth:`save_sharded`, in place. Collective.

        Args:
            directory: the checkpoint directory.
            model: a model returned by :meth:`prepare` (same architecture).
            optimizer: its optimizer (same type and parameter groups), or ``None``.
        """
        if not (Path(directory) / ".metadata").is_file():
            raise FileNotFoundError(
                f"{directory!r} holds no checkpoint (.metadata missing); pass a directory "
                "written by save_sharded"
            )
        state = self._checkpoint_state(model, optimizer)
        with _quiet_without_process_group():
            dcp.load(state, checkpoint_id=directory)
        if optimizer is None:
            set_state_dict(model, (), model_state_dict=state["model"], optim_state_dict={})
            return
        set_state_dict(
            model,
            _plain_optimizer(optimizer),
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )

    def _checkpoint_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> dict[str, Any]:
        model = self.unwrap(model)
        if optimizer is None:
            model_state, _ = get_state_dict(model, ())
            return {"model": model_state}
        model_state, optim_state = get_state_dict(model, _plain_optimizer(optimizer))
        return {"model": model_state, "optimizer": optim_state}

    def export_hf(
        self, model: nn.Module, tokenizer: Any, directory: str, processor: Any = None
    ) -> None:
        """Write ``model.backbone`` as a complete Hugging Face model directory. Collective.

        The main process saves into a temporary sibling directory and renames it into place,
        so ``directory`` never holds a half-written model; an existing ``directory`` is
        replaced. Wrapper parameters outside ``.backbone`` (e.g. a value head) are not part
        of the Hugging Face model and are not written.

        Args:
            model: a model returned by :meth:`prepare`.
            tokenizer: saved alongside (``save_pretrained``); ``None`` to skip.
            directory: destination directory.
            processor: a vision-language model's image processor, saved alongside.
        """
        state = self.full_state_dict(model)
        if self.is_main_process:
            prefix = "backbone."
            backbone_state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            target = Path(directory)
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
            _backbone_of(self.unwrap(model)).save_pretrained(staging, state_dict=backbone_state)
            for part in (tokenizer, processor):
                if part is not None:
                    part.save_pretrained(staging)
            _replace_directory(staging, target)
        self.barrier()

    # ----------------------------------------------------------------- cleanup
    def close(self, *, finished: bool = True) -> None:
        """Destroy the process group if this backend created it; release accelerate's state.

        Idempotent. Afterwards a new backend can be built in the same process.

        Args:
            finished: the work ended normally on every process, so the processes meet at
                a barrier before the group is destroyed. Without it the first process to
                finish tears down gloo's connections and the store while another still
                uses them, and a finished run can abort at exit (``terminate called
                without an active exception``). Pass ``False`` after an error: the other
                processes may never reach the barrier.
        """
        if self._closed:
            return
        self._closed = True
        if self._owns_process_group and dist.is_initialized():
            if finished and dist.get_world_size() > 1:
                dist.barrier()
            dist.destroy_process_group()
        self._release()

    def _release(self) -> None:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        restore_env(self._saved_launch_env)
        restore_env({"ACCELERATE_USE_FSDP": self._saved_use_fsdp})


@contextmanager
def _quiet_without_process_group() -> Iterator[None]:
    # One plain process has no process group; DCP then warns that it assumes exactly that.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is .*single process")
        yield


def _without_aliases(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    # On CPU, `.cpu()` (and a gather over a one-process mesh) returns the live parameter
    # storage; copy exactly those tensors so the result is a snapshot.
    live = {_storage_of(t) for t in (*model.parameters(), *model.buffers())}
    return {k: v.clone() if _storage_of(v) in live else v for k, v in state.items()}


def _storage_of(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.untyped_storage().data_ptr()


def _replace_directory(staging: Path, target: Path) -> None:
    # A rename is atomic; a directory cannot be renamed over a non-empty one, so an old
    # export is first moved aside and deleted after the new one is in place.
    if target.exists():
        retired = target.parent / f".{target.name}.old-{uuid.uuid4().hex}"
        target.rename(retired)
        staging.rename(target)
        shutil.rmtree(retired)
    else:
        staging.rename(target)

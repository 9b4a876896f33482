"""rlkit's vLLM worker extension: per-group weight checksums, computed where the weights live.

After a weight sync the trainer asks every server whether it now holds the trainer's
weights (:mod:`rlkit.rollout.servers.weight_check`). A vLLM server answers through
``POST /collective_rpc`` with ``{"method": "rlkit_weight_checksums"}``, which runs
:meth:`RlkitWorkerExtension.rlkit_weight_checksums` on every worker of the server. rlkit
starts its servers with ``--worker-extension-cls rlkit_vllm_worker.RlkitWorkerExtension``
and this file's folder on ``PYTHONPATH``; vLLM then adds the class to its worker's bases.

The file is self-contained (standard library and torch only): it is imported by the
server's interpreter, in vLLM's own environment, where rlkit is not installed.

What is summed is what the forward pass reads, not only what ``named_parameters``
shows. vLLM's CPU backend repacks every linear layer's weight for its GEMM kernel
(oneDNN, or a VNNI layout) and leaves an empty ``weight`` parameter behind; the LM head
keeps its ``weight`` but computes logits from a packed copy of it. Such a weight is read
back through the layer's own kernel (``cpu_linear``) applied to rows of the identity:
row ``i`` of the result is column ``i`` of the weight, exactly (every product is by 0 or
1 and every sum adds zeros), so a packed copy that a reload forgot to refresh shows up.
This costs ``in_features`` multiply-adds per weight element, as much as a forward pass
over ``in_features`` tokens (hidden or MLP size): nothing for the tiny models of the
tests, seconds or more for a model of billions of parameters on a CPU (``verify_every``
makes the check sparse). On a GPU the weights are read as they are.

Each worker sums the part of the model it holds. Under tensor parallelism those parts
do not add up to the model's sums (norms are replicated on every worker, and so are the
key/value heads when there are fewer of them than workers), so the engine compares the
checksums of single-worker servers only and leaves the others to its log-prob probe.
"""

from __future__ import annotations

import re
from typing import Any

import torch

#: Bumped when the answer's meaning changes; the engine checks it.
VERSION = 1

#: Elements converted to float64 at once (bounds the extra memory to 128 MiB).
_CHUNK = 1 << 24
#: Rows of the identity sent through a packed linear kernel at once.
_IDENTITY_ROWS = 256

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def parameter_group(name: str) -> str:
    """The checksum group of a parameter name.

    A copy of :func:`rlkit.rollout.servers.weight_check.parameter_group` (this file
    cannot import rlkit; ``tests/vllm/test_vllm_extension_units.py`` checks that the two
    agree):
    ``layers.N`` for anything in decoder layer ``N``, otherwise the name without its
    ``model.`` prefix and ``.weight`` / ``.bias`` suffix.
    """
    layer = _LAYER.search(name)
    if layer:
        return f"layers.{layer.group(1)}"
    base = re.sub(r"\.(weight|bias)$", "", name)
    return base.removeprefix("model.")


def tensor_sums(tensor: torch.Tensor) -> tuple[float, float, float]:
    """``(sum x, sum |x|, sum x^2)`` of ``tensor``'s elements, in float64."""
    flat = tensor.detach().reshape(-1)
    total = [0.0, 0.0, 0.0]
    for start in range(0, flat.numel(), _CHUNK):
        x = flat[start : start + _CHUNK].to(torch.float64)
        total[0] += float(x.sum())
        total[1] += float(x.abs().sum())
        total[2] += float((x * x).sum())
    return total[0], total[1], total[2]


def kernel_weight_sums(
    kernel: Any, weight: torch.Tensor, in_features: int
) -> tuple[float, float, float]:
    """The sums of the weight a packed linear ``kernel(x, weight, bias)`` multiplies by,
    read back by sending the identity through it, a block of rows at a time."""
    total = [0.0, 0.0, 0.0]
    device = weight.device
    with torch.no_grad():
        for start in range(0, in_features, _IDENTITY_ROWS):
            rows = min(_IDENTITY_ROWS, in_features - start)
            eye = torch.zeros(rows, in_features, dtype=weight.dtype, device=device)
            eye[torch.arange(rows), torch.arange(start, start + rows)] = 1
            columns = kernel(eye, weight, None)
            for i, value in enumerate(tensor_sums(columns)):
                total[i] += value
    return total[0], total[1], total[2]


def _packed_kernel(module: torch.nn.Module) -> Any:
    """The CPU backend's packed GEMM of ``module`` (``cpu_linear``), else ``None``."""
    kernel = getattr(module, "cpu_linear", None)
    return kernel if callable(kernel) else None


def model_checksums(model: torch.nn.Module) -> dict[str, tuple[float, float, float]]:
    """Per :func:`parameter_group`, the sums of the weights ``model``'s forward pass uses.

    Parameters are those of each module (buffers such as rotary tables and attention
    scales are not weights the trainer has). A parameter two modules share (tied
    embeddings) counts under each name, as in a Hugging Face state dict. A linear layer
    whose weight the CPU backend moved into a packed kernel is read through that
    kernel. The LM head (``model.lm_head``) is read through its kernel when it has one:
    the logits come from there even where its ``weight`` is still a parameter (equal to
    the input embedding's when tied), and a reload that refreshed the parameter but not
    the packed copy must show. It is reported as ``lm_head`` even when it is the input
    embedding's module itself.
    """
    sums: dict[str, list[float]] = {}

    def add(group: str, values: tuple[float, float, float]) -> None:
        total = sums.setdefault(group, [0.0, 0.0, 0.0])
        for i, value in enumerate(values):
            total[i] += value

    head = getattr(model, "lm_head", None)
    head_counted = False
    for module_name, module in model.named_modules():
        kernel = _packed_kernel(module)
        for param_name, param in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            group = parameter_group(name)
            if param_name == "weight" and kernel is not None and param.numel() == 0:
                in_features = getattr(module, "input_size_per_partition", None)
                if in_features is None:
                    raise RuntimeError(
                        f"{name}: the CPU backend packed this weight and the layer does not "
                        f"say its input size, so it cannot be read back"
                    )
                add(group, kernel_weight_sums(kernel, param, int(in_features)))
            elif module is head and param_name == "weight" and group == "lm_head":
                add(group, _head_sums(module, param))
                head_counted = True
            else:
                add(group, tensor_sums(param))
    weight = getattr(head, "weight", None)
    if not head_counted and isinstance(weight, torch.Tensor):
        add("lm_head", _head_sums(head, weight))  # the embedding's module serves as head
    return {group: (s[0], s[1], s[2]) for group, s in sums.items()}


def _head_sums(head: torch.nn.Module, weight: torch.Tensor) -> tuple[float, float, float]:
    kernel = _packed_kernel(head)
    if kernel is None or weight.dim() != 2:
        return tensor_sums(weight)
    return kernel_weight_sums(kernel, weight, int(weight.shape[1]))


class RlkitWorkerExtension:
    """Methods vLLM adds to its worker class (``--worker-extension-cls``); each is
    called on every worker through ``POST /collective_rpc``. Names start with
    ``rlkit_`` so they never shadow a worker's own."""

    def rlkit_extension_info(self) -> dict[str, Any]:
        """Which version of this extension the worker runs, the dtype it holds the
        weights in (the trainer rounds its own to it before comparing), and where it
        sits in the server's parallel layout (a shard's sums are not the model's)."""
        config = getattr(self, "vllm_config", None)
        parallel = getattr(config, "parallel_config", None)
        return {
            "version": VERSION,
            "dtype": str(getattr(getattr(config, "model_config", None), "dtype", "")),
            "rank": int(getattr(self, "rank", 0)),
            "tensor_parallel_size": int(getattr(parallel, "tensor_parallel_size", 1)),
            "pipeline_parallel_size": int(getattr(parallel, "pipeline_parallel_size", 1)),
        }

    def rlkit_weight_checksums(self) -> dict[str, list[float]]:
        """This worker's ``{group: [sum x, sum |x|, sum x^2]}`` (:func:`model_checksums`)."""
        runner = self.model_runner  # type: ignore[attr-defined]  (the worker's)
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        return {group: list(values) for group, values in model_checksums(model).items()}

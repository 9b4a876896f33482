"""TrainingBackend in the test process itself: one unsharded process, and refused inputs."""

from __future__ import annotations

import pytest
import torch
from accelerate.state import AcceleratorState
from torch import nn

from rlkit.distributed.collectives import all_reduce
from rlkit.models.tiny import build_tiny_qwen2, train_byte_tokenizer
from rlkit.trainer.backend import TrainingBackend
from tests.distributed.tiny_actor import TinyActor, global_batch, global_loss_of_slice


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("tiny"), train_byte_tokenizer()))


@pytest.fixture
def backend():
    b = TrainingBackend(strategy="auto", seed=0)
    yield b
    b.close()


def test_auto_with_one_process_is_an_unsharded_plain_module(backend, model_dir):
    actor, optimizer = backend.prepare(TinyActor(model_dir), lambda ps: torch.optim.SGD(ps, 0.1))
    assert not backend.is_sharded
    assert (backend.num_processes, backend.process_index, backend.is_main_process) == (1, 0, True)
    assert backend.unwrap(actor) is actor
    assert not any(type(p).__name__ == "DTensor" for p in actor.parameters())
    with backend.generation_context(actor) as extra:
        assert extra == {}


def test_loss_scaled_by_one_process_is_the_plain_global_loss(backend, model_dir):
    # With one process, num_processes = 1: the scaled loss is exactly the global-batch loss.
    actor, _ = backend.prepare(TinyActor(model_dir), lambda ps: torch.optim.SGD(ps, 0.1))
    batch = global_batch(actor.backbone.config.vocab_size)
    scaled = global_loss_of_slice(actor, batch, slice(0, 4), backend.num_processes)
    token_mask = (batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).float()
    log_probs = actor(batch["input_ids"], batch["attention_mask"])
    plain = (-batch["weights"][:, None] * log_probs * token_mask).sum() / token_mask.sum()
    assert torch.equal(scaled, plain)


def test_clip_grad_norm_returns_total_norm_and_clips_to_max(backend):
    model = nn.Linear(2, 1, bias=False)
    model.weight.grad = torch.tensor([[3.0, 4.0]])  # norm sqrt(9 + 16) = 5
    norm = backend.clip_grad_norm_(model, max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    # clipped to norm 1: [3, 4] * 1 / (5 + 1e-6)
    assert torch.allclose(model.weight.grad, torch.tensor([[0.6, 0.8]]), atol=1e-6)


def test_clip_grad_norm_returns_non_finite_norm_as_is(backend):
    model = nn.Linear(2, 1, bias=False)
    model.weight.grad = torch.tensor([[float("inf"), 1.0]])
    assert backend.clip_grad_norm_(model, max_norm=1.0).isinf()


def test_all_reduce_with_one_process_returns_the_input(backend):
    t = torch.tensor([1.0, 2.0])
    for op in ("sum", "mean", "max", "min"):
        assert all_reduce(t, op) is t and t.tolist() == [1.0, 2.0]


def test_all_reduce_rejects_unknown_op(backend):
    with pytest.raises(ValueError, match="unknown reduce op 'avg'"):
        all_reduce(torch.ones(1), "avg")


def test_full_state_dict_is_a_snapshot_not_the_live_parameters(backend, model_dir):
    actor, optimizer = backend.prepare(TinyActor(model_dir), lambda ps: torch.optim.SGD(ps, 1.0))
    state = backend.full_state_dict(actor)
    before = {k: v.clone() for k, v in state.items()}
    batch = global_batch(actor.backbone.config.vocab_size)
    backend.backward(global_loss_of_slice(actor, batch, slice(0, 4), 1))
    optimizer.step()
    assert all(torch.equal(state[k], before[k]) for k in state)
    assert not torch.equal(
        actor.backbone.model.norm.weight.detach(), before["backbone.model.norm.weight"]
    )


def test_save_sharded_needs_an_existing_directory(backend, model_dir, tmp_path):
    actor, _ = backend.prepare(TinyActor(model_dir))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        backend.save_sharded(str(tmp_path / "missing"), actor, None)
    with pytest.raises(FileNotFoundError, match=".metadata missing"):
        backend.load_sharded(str(tmp_path), actor, None)


def test_frozen_model_round_trips_through_save_and_load_without_optimizer(
    backend, model_dir, tmp_path
):
    actor, _ = backend.prepare(TinyActor(model_dir))
    backend.save_sharded(str(tmp_path), actor, None)
    other, _ = backend.prepare(TinyActor(model_dir))
    with torch.no_grad():
        other.backbone.model.norm.weight.zero_()
    backend.load_sharded(str(tmp_path), other, None)
    assert torch.equal(other.backbone.model.norm.weight, actor.backbone.model.norm.weight)


def test_prepare_refuses_a_model_without_backbone(backend):
    with pytest.raises(TypeError, match="no nn.Module at `.backbone`"):
        backend.prepare(nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "ddp"}, "unknown strategy 'ddp'"),
        ({"mixed_precision": "fp8"}, "unknown mixed_precision 'fp8'"),
        ({"strategy": "fsdp2", "cpu_offload": True}, "needs an accelerator"),
        ({"strategy": "none", "cpu_offload": True}, "needs an accelerator and sharding"),
    ],
)
def test_invalid_configurations_are_refused_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainingBackend(**kwargs)
    assert not AcceleratorState._shared_state  # nothing was initialised


def test_strategy_none_is_refused_when_the_launcher_says_two_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="2 processes were launched"):
        TrainingBackend(strategy="none")


def test_single_process_accelerate_launch_warns_to_add_multi_gpu(monkeypatch):
    # What `accelerate launch --num_processes 2` exports when it starts only one process.
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "NO")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.warns(UserWarning, match="add --multi_gpu"):
        TrainingBackend(strategy="none").close()


def test_close_is_idempotent_and_allows_a_new_backend():
    first = TrainingBackend(strategy="none")
    first.close()
    first.close()
    second = TrainingBackend(strategy="none")
    assert second.num_processes == 1
    second.close()

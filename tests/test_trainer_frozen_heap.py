"""frozen_heap: training's full garbage collections skip the objects alive when it began."""

from __future__ import annotations

import gc
import weakref

import pytest

from rlkit.trainer.frozen_heap import frozen_heap
from rlkit.trainer.trainer import RLTrainer
from tests.experiment_factory import small_experiment


class Node:
    """A weak-referenceable object that can sit in a reference cycle."""

    partner: Node | None = None


def cycle() -> weakref.ref:
    """A two-object reference cycle whose only strong references are its own."""
    a, b = Node(), Node()
    a.partner, b.partner = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def nothing_frozen():
    assert gc.get_freeze_count() == 0, "another test left objects frozen"
    yield
    gc.unfreeze()


def test_garbage_on_entry_is_collected_and_the_survivors_frozen():
    garbage = cycle()
    assert garbage() is not None  # a cycle: only the collector frees it
    alive = Node()
    with frozen_heap() as frozen:
        assert garbage() is None
        assert frozen > 0 and gc.get_freeze_count() > 0  # (frozen objects still die by refcount)
        assert not any(o is alive for o in gc.get_objects())  # frozen: untracked by collections
    assert gc.get_freeze_count() == 0
    assert any(o is alive for o in gc.get_objects())


def test_a_frozen_cycle_that_dies_during_the_block_is_collected_after_it():
    a = Node()
    a.partner = Node()
    a.partner.partner = a
    dead = weakref.ref(a)
    with frozen_heap():
        del a
        gc.collect()
        assert dead() is not None  # frozen objects are not collected...
    gc.collect()
    assert dead() is None  # ...until they are handed back


def test_a_process_that_froze_objects_itself_keeps_its_freeze():
    kept = Node()
    gc.freeze()
    with frozen_heap() as frozen:
        assert frozen == 0
    # Still frozen: untracked by collections. (The freeze count itself may fall meanwhile:
    # frozen objects that other threads release die by refcount.)
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())


@pytest.mark.parametrize("freeze", [True, False])
def test_train_runs_its_steps_with_the_setup_objects_frozen_when_asked(
    demo_model_dir, tmp_path, freeze
):
    cfg = small_experiment(
        demo_model_dir, tmp_path / "run", trainer={"freeze_setup_objects": freeze}
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    frozen_during_steps = []
    untimed_step = trainer.step

    def step():
        frozen_during_steps.append(gc.get_freeze_count())
        return untimed_step()

    trainer.step = step  # the instance attribute shadows the method inside train()
    try:
        history = trainer.train()
    finally:
        trainer.cleanup()
    assert len(history) == len(frozen_during_steps) == 2
    if freeze:
        assert min(frozen_during_steps) > 10_000  # imports, model, data: many objects
    else:
        assert frozen_during_steps == [0, 0]
    assert gc.get_freeze_count() == 0

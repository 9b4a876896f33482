"""Weight syncs that never overlap a generation: every token gets the version that sampled it.

Rollouts running ahead of the trainer (``TrainerConfig.rollout_mode = "async"``) keep
several generation calls in flight while the trainer asks for new weights to be synced. A
:class:`WeightGate` orders the two like a readers-writer lock that prefers the writer:

* a generation call enters :meth:`WeightGate.generating` and reads the version the engine
  holds; any number may be inside at once;
* a sync enters :meth:`WeightGate.syncing` (or :meth:`begin_sync`, :meth:`wait_drained`,
  :meth:`end_sync` from two threads): no new call starts, the calls already inside finish
  under the weights they started with (``partial_rollout = "finish"``), then the engine
  takes the new weights and the waiting calls start with them. With ``"continue"`` the
  sync skips :meth:`wait_drained`; the engine then reports the version of each token of
  the calls it updated under.

A call's version is therefore exact for all its tokens, multi-turn calls included.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class WeightGate:
    """A readers-writer lock between generation calls (readers) and weight syncs (writer)."""

    def __init__(self, version: int = 0) -> None:
        self._cond = threading.Condition()
        self._inside = 0  # generation calls running
        self._syncing = False
        self.version = version
        """The weights version the engine samples from; changes only inside a sync."""
        self.finished_across_sync = 0
        """Generation calls that were running when a sync began: they finish under the
        older weights, or go on under the newer (``async/partial_rollouts``)."""

    @contextmanager
    def generating(self) -> Iterator[int]:
        """One generation call; yields the weights version its tokens are sampled with."""
        with self._cond:
            while self._syncing:
                self._cond.wait()
            self._inside += 1
            version = self.version
        try:
            yield version
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    def begin_sync(self) -> None:
        """Stop new generation calls from starting (at once, in the caller's thread); the
        calls running go on. Follow with :meth:`wait_drained` and :meth:`end_sync`."""
        with self._cond:
            while self._syncing:  # one sync at a time
                self._cond.wait()
            self._syncing = True
            self.finished_across_sync += self._inside

    def wait_drained(self) -> None:
        """Return once the generation calls running at :meth:`begin_sync` have finished."""
        with self._cond:
            while self._inside:
                self._cond.wait()

    def end_sync(self, version: int | None) -> None:
        """The engine holds ``version`` now (``None``: the sync failed, the version stays);
        waiting generation calls start."""
        with self._cond:
            if version is not None:
                self.version = version
            self._syncing = False
            self._cond.notify_all()

    @contextmanager
    def syncing(self, version: int) -> Iterator[None]:
        """A weight sync to ``version`` in one thread: entered once no generation call runs."""
        self.begin_sync()
        self.wait_drained()
        try:
            yield
        except BaseException:
            self.end_sync(None)
            raise
        self.end_sync(version)

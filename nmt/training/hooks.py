"""The training loop's periodic work, each piece registered with its interval in steps.

    hooks = Hooks([Periodic("log", every=50, action=write_log_line, at_stop=write_log_line),
                   Periodic("save", every=1000, action=save, at_stop=save, when_interrupted=True)])
    stop = hooks.run_due(step)                 # after each step: the work due, in order
    hooks.run_at_stop(interrupted=False)       # once, when training stops

Work due at the same step runs in the order it was registered, and so does the work at stop.
That order is part of what a run writes (the log line of a step comes before its validation,
which comes before its checkpoint), so exact resumption depends on it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

if TYPE_CHECKING:
    from nmt.training.stopping import StopReason


@dataclasses.dataclass(frozen=True)
class Periodic:
    """One piece of periodic work, so that the loop need not know what it does or how often.

    name:     what it is called in messages and tests
    every:    `action` runs after every step that is a multiple of `every`
    action:   the work; returns why training must stop (a `StopReason`), or None to go on
    at_stop:  the work once more when training stops (None: nothing)
    when_interrupted: whether `at_stop` runs also when SIGINT/SIGTERM stopped training (an
              interrupted run that is resumed must write what an uninterrupted one would)
    """

    name: str
    every: int
    action: Callable[[], StopReason | None]
    at_stop: Callable[[], object] | None = None
    when_interrupted: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"periodic work {self.name!r}: `every` must be a whole number of "
                             f"steps >= 1, got {self.every!r}.")

    def due(self, step: int) -> bool:
        """Whether the action runs after `step`."""
        return step % self.every == 0


class Hooks:
    """The periodic work in registration order, which is the order it runs in."""

    def __init__(self, hooks: Iterable[Periodic] = ()):
        self._hooks: list[Periodic] = []
        for hook in hooks:
            self.add(hook)

    def add(self, hook: Periodic) -> None:
        """Register `hook` to run after those registered before it."""
        if hook.name in self.names:
            raise ValueError(f"periodic work {hook.name!r} is registered already.")
        self._hooks.append(hook)

    def __iter__(self) -> Iterator[Periodic]:
        """The hooks in the order they run."""
        return iter(self._hooks)

    @property
    def names(self) -> list[str]:
        """The hooks' names in the order they run."""
        return [hook.name for hook in self._hooks]

    def run_due(self, step: int) -> StopReason | None:
        """Run the work due after `step` in order. The first one that says to stop ends the
        step's work (the rest is left to `run_at_stop`); returns its reason, or None."""
        for hook in self._hooks:
            if hook.due(step):
                stop = hook.action()
                if stop is not None:
                    return stop
        return None

    def run_at_stop(self, interrupted: bool) -> None:
        """Run the work at stop in order; after SIGINT/SIGTERM (`interrupted`), only the work
        marked `when_interrupted`."""
        for hook in self._hooks:
            if hook.at_stop is not None and (hook.when_interrupted or not interrupted):
                hook.at_stop()

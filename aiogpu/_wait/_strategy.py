"""The strategy names and the process-wide default (``set_default_wait_strategy``)."""

from __future__ import annotations

from typing import Literal, get_args

WaitStrategy = Literal["auto", "poll", "thread", "callback"]
STRATEGIES: tuple[str, ...] = get_args(WaitStrategy)
#: Strategies that never watch on the loop: a thread or the driver tells the loop when to look.
OFF_LOOP = ("callback", "thread")

_default: WaitStrategy = "auto"


def check_strategy(strategy: object) -> WaitStrategy:
    """``strategy`` if it names a strategy (``None``: the process-wide default)."""
    if strategy is None:
        return _default
    if not isinstance(strategy, str):
        raise TypeError(f"wait strategy must be a str, one of {STRATEGIES}; got {strategy!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown wait strategy {strategy!r}; expected one of {STRATEGIES}")
    return strategy  # type: ignore[return-value]


def set_default_wait_strategy(strategy: WaitStrategy) -> None:
    """Set the strategy ``await event`` uses when the call does not name one.

    Args:
        strategy: ``"auto"``, ``"poll"``, ``"thread"`` or ``"callback"``; see the user guide's
            "Wait strategies and how to choose".

    Raises:
        TypeError: ``strategy`` is not a string.
        ValueError: ``strategy`` is not a known strategy.
    """
    global _default
    if strategy is None:
        raise TypeError(f"wait strategy must be a str, one of {STRATEGIES}; got None")
    _default = check_strategy(strategy)


def get_default_wait_strategy() -> WaitStrategy:
    """The strategy ``await event`` uses when the call does not name one (initially ``"auto"``)."""
    return _default

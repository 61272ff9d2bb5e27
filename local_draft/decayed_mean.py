"""An exponentially forgetting mean: what the drafting controllers measure with.

Each controller forgets at its own pace (`memory`, the weight the past keeps at each new value),
so each subclasses this with its own; the weight says how much evidence the mean holds.
"""

from __future__ import annotations


class DecayedMean:
    memory = 0.9  # a subclass sets its own

    def __init__(self, total: float = 0.0, weight: float = 0.0):
        self.total, self.weight = total, weight

    def add(self, value: float, weight: float = 1.0) -> None:
        self.total = self.total * self.memory + value * weight
        self.weight = self.weight * self.memory + weight

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight > 1e-9 else None

"""Per-device memory of one training step, component by component (names as in design.md)."""

from estimator.memory.model import MemoryBreakdown, memory_breakdown

__all__ = ["MemoryBreakdown", "memory_breakdown"]

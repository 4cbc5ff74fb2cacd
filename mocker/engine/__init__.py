"""The engine: a synchronous core stepped by a live (wall-clock) or a virtual-clock driver."""

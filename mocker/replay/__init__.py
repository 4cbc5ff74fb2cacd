"""Offline replay: a recorded or generated trace through the engine core on a virtual clock."""

"""Storage below the device pool: one residency protocol, the CPU and storage tiers, their
links, store policies and the scheduler-side connector."""

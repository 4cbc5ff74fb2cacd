"""Memory tiers below the device pool: the host tier, its links and transfer scheduling."""

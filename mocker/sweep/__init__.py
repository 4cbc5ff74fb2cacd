"""`mocker sweep`: a grid of replays, on local cores or a Ray cluster, into one table."""

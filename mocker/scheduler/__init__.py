"""Scheduling: which requests run in the next pass and how many tokens each computes."""

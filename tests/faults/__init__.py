"""Faults injected into real runs: killed backends, failed commits, hangs, restarts, load, Ctrl-C."""

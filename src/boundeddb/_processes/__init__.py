"""ProcessRunner, both sides: the parent that hands out units, and the worker processes that run them."""

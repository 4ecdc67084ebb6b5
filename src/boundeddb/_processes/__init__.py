"""ProcessRunner's two sides: the parent (fleet, call, ledger), the workers (worker, worker_call), the protocol."""

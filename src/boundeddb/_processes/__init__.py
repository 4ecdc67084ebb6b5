"""ProcessRunner's two sides: parent (fleet, call, ledger), workers (worker, worker_call), protocol."""

"""The runners end to end on real databases: contract, cancellation, retries, timeouts, misuse."""

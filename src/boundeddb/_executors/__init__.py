"""How one attempt runs in its own session and transaction: on the event loop, or in a thread."""

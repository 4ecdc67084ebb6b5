"""The database-agnostic core: runs, slots, attempts and pacing (anyio only, never SQLAlchemy)."""

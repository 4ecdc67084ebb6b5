"""The database-agnostic core of every runner, built on anyio alone and never on SQLAlchemy."""

"""Particular databases, drivers and deployments: MySQL, SQLite, PgBouncer, pgserver, uvicorn."""

"""The SQL usage store: the Redis usage stream's records, kept in SQLite or PostgreSQL."""

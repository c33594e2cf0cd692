"""The SQL usage store: the Redis usage stream's records kept in SQLite or PostgreSQL.

`schema` (tables and versioned migrations), `store` (inserts with rollups, the reads,
retention) with the SQL it runs written per driver in `insert_sql` (PostgreSQL's batches),
`sqlite_writer` (SQLite's, in a thread of their own), `rollup_sql` (the rollups, made by the
database from a batch's staged records) and `export_sql`,
`summary_sql` (which rollups a summary reads, in one statement) and `summary_rows` (its rows as
returned),
`consumer` and `service` (the consumer group that moves the stream into the store, opened with
the app), `rows` and `sketch` (a record's row and the latency histogram), `pricing` (cost at
settlement), `queries` (summaries, records, CSV export), `admin` and `cli` (the reports over
HTTP and the command line); its settings are `[usage]` (`gateway.config.usage`).

May import `gateway.config`, `gateway.keys`, `gateway.observability`, `gateway.errors`,
`providers` and `plumbing`."""

"""Plumbing every layer uses: immutable value classes (`record`), JSON on the hot path
(`jsoncodec`), writes batched by loop turn (`turn_writes`) and polling while fast answers are
awaited (`busy_wait`).

The bottom package: it imports neither `gateway`, `providers` nor `backend`."""

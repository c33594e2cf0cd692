"""The usage store's ingest (records/s from the Redis usage stream through the consumer into
the store, `benchmarks/usage_store.py`'s figure, target >= 20,000/s) of two or more source
trees, measured in turns in one run, so that a loaded machine's drift falls on all of them
alike; prints each tree's median and its ratio to the first tree's.

    .venv/bin/python benchmarks/usage_ingest_trees.py BEFORE AFTER [...] [--records 100000]
        [--rounds 3] [--backends sqlite,postgresql]

Each TREE is a checkout (e.g. `git worktree add /tmp/before main`); each turn runs that tree's
own `benchmarks/usage_store.py` ingest in a child process (this virtualenv, the tree on the
path) into a new, empty store: a SQLite file, or a new database on one private PostgreSQL
server (fsync on) shared by every turn. Needs the shared Redis (127.0.0.1:6379).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.postgres import PrivatePostgres  # noqa: E402

_CHILD = """
import asyncio, sys
from benchmarks.usage_store import ingest
from gateway.config.usage import UsageSettings
from gateway.usage_store.store import UsageStore

async def main():
    store = await UsageStore.open(sys.argv[1])
    try:
        print(await ingest(store, int(sys.argv[2]), UsageSettings().batch_size))
    finally:
        await store.aclose()

asyncio.run(main())
"""


def _turn(tree: Path, url: str, records: int) -> float:
    """One tree's ingest rate into the empty store at `url`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, url, str(records)],
        cwd=tree,
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: the ingest failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    pg = None
    if "postgresql" in args.backends:
        pg = PrivatePostgres(durable=True)
        pg.start()
    try:
        for backend in args.backends.split(","):
            rates: dict[Path, list[float]] = {tree: [] for tree in trees}
            for _ in range(args.rounds):
                for tree in trees:
                    with tempfile.TemporaryDirectory() as tmp:
                        if backend == "sqlite":
                            url = f"sqlite+aiosqlite:///{tmp}/usage.db"
                        else:
                            assert pg is not None
                            name = f"ingest_{uuid.uuid4().hex[:10]}"
                            pg.create_database(name)
                            url = pg.url(name)
                        rates[tree].append(_turn(tree, url, args.records))
            base = statistics.median(rates[trees[0]])
            print(f"{backend}: ingest of {args.records:,} records, median of {args.rounds}")
            for tree, found in rates.items():
                rate = statistics.median(found)
                runs = ", ".join(f"{r:,.0f}" for r in found)
                print(f"  {str(tree):<40} {rate:>10,.0f} records/s  x{rate / base:.2f}  ({runs})")
    finally:
        if pg is not None:
            pg.remove()


if __name__ == "__main__":
    main()

"""Two or more source trees (checkouts, e.g. `git worktree add /tmp/before HEAD~1`) measured
against each other in one run, so that the machine's drift falls on all of them alike:

    .venv/bin/python benchmarks/compare_trees.py pinned TREE TREE [...]   gateway CPU per request,
        every tree's gateway pinned to one core and loaded at the same time
    .venv/bin/python benchmarks/compare_trees.py workers TREE TREE [...]  keyed JSON req/s of 1
        and 2 workers, with the CPU per request of the gateway, Redis, nginx and wrk
    .venv/bin/python benchmarks/compare_trees.py redis TREE TREE [...]    Redis's CPU per keyed
        request (one admission and one settlement)
    .venv/bin/python benchmarks/compare_trees.py calls TREE TREE [...]    Python function calls
        per request of each tree's gateway (cProfile): a count the machine's load does not move

`COMMAND --help` lists each one's options.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.trees import calls, pinned, redis, workers  # noqa: E402

COMMANDS = {
    "pinned": pinned.main,
    "workers": workers.main,
    "redis": redis.main,
    "calls": calls.main,
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    command = sys.argv.pop(1)
    sys.argv[0] = f"compare_trees.py {command}"
    run = COMMANDS[command]
    if inspect.iscoroutinefunction(run):
        asyncio.run(run())
    else:
        run()


if __name__ == "__main__":
    main()

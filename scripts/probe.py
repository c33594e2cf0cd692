"""The outside tester: the gateway as a process of its own, served by the tiny demo engine, the
mock upstream and an upstream that breaks the protocol, probed the way clients and faults meet
it. Prints one line per check and a summary; exits 1 when any check failed.

    .venv/bin/python scripts/probe.py                  # every group (a few minutes on 2 cores)
    .venv/bin/python scripts/probe.py --only sdk raw   # some of them

Groups: `sdk` (every endpoint through the openai and anthropic SDKs: streaming and not, tools
and tool results, images, Codex's Responses items, Claude Code's Messages bodies, count_tokens,
odd model ids), `raw` (bad framing and bad input on raw sockets, odd methods, the admin API),
`faults` (a broken upstream on every protocol, slow clients, 24 clients leaving mid-stream,
Redis paused and killed mid-stream). The rules checked: bad input gets a 4xx in the API's own
error shape with an x-request-id, never a 500, a hang or a dropped connection; after a fault
every request has its usage record and the key holds no slot or reservation. Needs
redis-server; everything runs on 127.0.0.1 (a private Redis, upstreams in this process).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.probe import fault_checks, sdk_checks, wire_checks  # noqa: E402
from testkit.probe.results import Results  # noqa: E402
from testkit.probe.stage import staged  # noqa: E402

GROUPS = {"sdk": sdk_checks.run, "raw": wire_checks.run, "faults": fault_checks.run}


async def main(groups: list[str]) -> int:
    results = Results()
    started = time.monotonic()
    async with staged() as stage:
        for group in groups:
            await GROUPS[group](stage, results)
    failed = results.failed
    print(f"\n{len(results.rows) - len(failed)} of {len(results.rows)} checks passed "
          f"in {time.monotonic() - started:.0f} s")  # fmt: skip
    for group, name, _, seen in failed:
        print(f"FAILED {group} / {name}: {seen}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--only", nargs="+", choices=sorted(GROUPS), default=list(GROUPS))
    sys.exit(asyncio.run(main(parser.parse_args().only)))

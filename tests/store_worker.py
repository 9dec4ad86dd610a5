"""A claiming process for the store's concurrency tests: ``python -m tests.store_worker URL``.

Once a line arrives on stdin (the start barrier), claims jobs of ``render_job`` a few at a time
and completes each, printing the ids it claimed (one line each), until it finds the queue
empty ``--idle`` times in a row. With ``--forever`` it never completes and never stops (a
victim for kill -9).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sp00ky_infra.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--idle", type=int, default=20)
    parser.add_argument("--forever", action="store_true")
    args = parser.parse_args()
    store = open_store(args.url, migrate=False)
    owner = f"worker-{os.getpid()}"
    empty = 0
    print("ready", flush=True)
    sys.stdin.readline()  # the start barrier: every worker begins together
    while args.forever or empty < args.idle:
        now = time.time()
        jobs = store.claim("render_job", args.slots, owner, now, lease=600, machine=owner)
        if not jobs:
            empty += 1
            time.sleep(0.005)
            continue
        empty = 0
        for job in jobs:
            sys.stdout.write(f"{job.id}\n")
            if not args.forever:
                assert job.attempt is not None
                store.complete(job.id, job.attempt, {"by": owner}, time.time())
        sys.stdout.flush()
    store.close()


if __name__ == "__main__":
    main()

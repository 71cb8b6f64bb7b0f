"""What ``tests/test_launcher.py`` runs as ``python -m tests.apps.probe_main ACTION``: it writes
what it sees of its own start as one JSON line on stdout, then does ACTION."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main() -> None:
    child = subprocess.run(  # what a process this one starts inherits
        [sys.executable, "-c", "import os; print(os.environ.get('DURAFN_TEST_OWNER'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = {
        "name": __name__,
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "path": sys.path[:3],
        "token": os.environ.get("DURAFN_TEST_OWNER"),
        "child's token": child.stdout.strip(),
        "descriptors": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "stdout buffered": not sys.stdout.line_buffering,
        "stderr buffered": not sys.stderr.line_buffering,
    }
    print(json.dumps(seen), flush=True)
    print("to stderr", file=sys.stderr)
    action = sys.argv[1]
    if action == "raise":
        raise ValueError("the probe raised")
    if action == "exit":
        sys.exit(int(sys.argv[2]))
    if action == "message":
        sys.exit("a message on stderr")
    if action == "sleep":  # with a child in a session of its own, as a supervisor's
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
        print("started", flush=True)
        time.sleep(600)


if __name__ == "__main__":
    main()

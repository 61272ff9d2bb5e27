"""`specwire serve --exit-with-parent`: stop when the process that started us is gone.

The parent gives the service a pipe as standard input and writes nothing to it but, with
`--token-stdin`, the token's line (read before this watcher starts). When the
parent exits for any reason (a normal exit, a crash, SIGKILL) the kernel closes its end,
the read here returns end-of-file, and the service stops as if sent SIGTERM (cleanly,
closing its sessions). A pipe works on every POSIX system and, unlike Linux's
PR_SET_PDEATHSIG, does not fire when merely the parent *thread* that started us ends.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)


def exit_with_parent() -> None:
    """Watch standard input on a daemon thread; at end-of-file, SIGTERM this process."""

    fd = sys.stdin.fileno()

    def watch() -> None:
        try:
            # os.read, not sys.stdin: a thread blocked inside the buffered reader holds its
            # lock, and the interpreter aborts at exit when it cannot take that lock
            while os.read(fd, 4096):
                pass  # the parent never writes; anything read is ignored
        except OSError:
            pass
        log.info("the parent process is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="specwire-parent-watch", daemon=True).start()

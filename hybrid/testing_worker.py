"""A torchrun worker that runs as a fork of hybrid.testing's forkserver: what `hybrid.testing.fork_service` puts
after `torchrun --no-python`, started by the real torchrun agent in place of `python -u ARGV`.

    torchrun --no-python --nproc-per-node 4 ... python -S hybrid/testing_worker.py -m hybrid.train --flags

It imports nothing beyond the standard library's C-backed modules (~20 ms), connects to the service named by
HYBRID_FORK_SERVICE (a Unix socket of the test process), and hands it its argv, environment (torchrun's RANK,
WORLD_SIZE, TORCHELASTIC_ERROR_FILE, ...), working directory and stdin / stdout / stderr: the service forks the
rank from the forkserver (torch and hybrid already imported) with those, so the rank writes to torchrun's own
pipes and error file. This process then stands for the rank in torchrun's process tree: the signals torchrun
sends it (SIGTERM at a teardown) are forwarded to the rank, and it ends as the rank ended -- the same exit status,
or killed by the same signal. Killed itself (SIGKILL of its process group), its connection closes and the
service SIGKILLs the rank: torchrun's killpg reaches both, as it reaches a real worker.
"""

import json
import os
import signal
import socket
import struct
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCONT)


def _line(conn: socket.socket, buf: bytearray) -> str:
    """The next newline-ended message from the service; '' when it closed the connection."""
    while b"\n" not in buf:
        chunk = conn.recv(64)
        if not chunk:
            return ""
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line.decode()


def main(argv: list[str]) -> None:
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(os.environ["HYBRID_FORK_SERVICE"])
    socket.send_fds(conn, [struct.pack("!Q", len(request))], [0, 1, 2])
    conn.sendall(request)
    buf = bytearray()
    pid = int(_line(conn, buf) or 0)
    if not pid:
        sys.exit("testing_worker: the fork service could not start the rank")
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    status = _line(conn, buf)
    if not status:
        sys.exit("testing_worker: the fork service ended before the rank")
    code = int(status)
    if code < 0:  # killed by signal -code: end the same way
        if -code in FORWARDED:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)  # a signal whose default action does not end a process: the shell's status for it
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main(sys.argv[1:])

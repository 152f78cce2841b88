"""What the command-line tools (bench, tune) share about how they were started."""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys


def standalone_env() -> None:
    """Without torchrun (no RANK), run as a world of one."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def command_line(module: str) -> str:
    """How this run was started, as a user would type it (per host under torchrun)."""
    args = shlex.join(sys.argv[1:])
    if "TORCHELASTIC_RUN_ID" in os.environ:
        nproc = os.environ.get("LOCAL_WORLD_SIZE", "?")
        nodes = os.environ.get("GROUP_WORLD_SIZE", "1")
        nnodes = f"--nnodes {nodes} " if nodes not in ("", "1") else ""
        return f"torchrun {nnodes}--nproc-per-node {nproc} -m {module} {args}".rstrip()
    return f"python -m {module} {args}".rstrip()


class RankZeroParser(argparse.ArgumentParser):
    """An ArgumentParser whose help, usage and errors only rank 0 prints.

    Under torchrun every rank parses the same command line; ``--help`` or a
    usage error would otherwise print once per rank. Every rank still exits
    with argparse's code."""

    def _print_message(self, message, file=None):
        if os.environ.get("RANK", "0") == "0":
            super()._print_message(message, file)

"""The launcher's exceptions (one place, so the CLI maps each to one exit code)."""

from __future__ import annotations


class ClusterUnavailable(RuntimeError):
    """This machine cannot host an emulated cluster (not root, not Linux, a tool
    missing, or the kernel refused a namespace). The CLI exits 2 with the message."""


class ClusterSetupError(RuntimeError):
    """A command that builds the network failed (after some of it existed)."""


class ClusterTimeout(TimeoutError):
    """A job ran past its timeout; every host's processes were killed."""

    def __init__(self, message: str, outputs: list[list[str]]):
        super().__init__(message)
        self.outputs = outputs

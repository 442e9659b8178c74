"""Small command-line helpers shared by the scripts: one-line argparse errors and typed values."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line ("prog: error: ..."), not the usage block."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def package_version(pkg: str) -> str:
    """Installed version of `pkg`, or "not installed" (for benchmark reports)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what platform knows (for benchmark reports)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()

# SPDX-License-Identifier: MIT
"""Fixtures of the Python binding's tests: a real kvarena-agent per test (or
per module), kvarena-ctl, and helpers to run Python code in another process.

Paths come from the environment (tests/python/meson.build sets them):
KVARENA_LIB (libkvarena.so), KVARENA_AGENT, KVARENA_CTL, KVARENA_EXAMPLES,
KVARENA_CUDASTUB_DIR (the CUDA driver stand-in, optional).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest

import kvarena

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _path(var: str, default: Optional[Path]) -> str:
    value = os.environ.get(var)
    if value:
        return value
    if default is not None and default.exists():
        return str(default)
    pytest.exit(f"{var} is not set (tests/python/meson.build sets it: run `meson test "
                "--suite python`)", returncode=2)
    raise AssertionError


AGENT = _path("KVARENA_AGENT", ROOT / "build/release/agent/kvarena-agent")
CTL = _path("KVARENA_CTL", ROOT / "build/release/agent/kvarena-ctl")
EXAMPLES = os.environ.get("KVARENA_EXAMPLES", str(ROOT / "examples"))
# a small default geometry: 16-token blocks, 2 layers, 2 KV heads of 64, f16
GEOMETRY = ["--block-tokens", "16", "--layers", "2", "--kv-heads", "2", "--head-dim", "64"]


class Agent:
    """A kvarena-agent of our own, in a temporary directory."""

    def __init__(self, args: Sequence[str] = (), env: Optional[dict] = None) -> None:
        # short: a Unix socket path has 108 bytes at most
        self.dir = tempfile.mkdtemp(prefix="kva-py-")
        self.socket = os.path.join(self.dir, "agent.sock")
        self.log_path = os.path.join(self.dir, "agent.log")
        self.args = list(args)
        cmd = [AGENT, "--socket", self.socket, "--log-level", "debug", *self.args]
        if not any(a in ("--blocks", "--memory") for a in self.args):
            cmd += ["--blocks", "256"]
        if "--block-tokens" not in self.args:
            cmd += GEOMETRY
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env)
        deadline = time.monotonic() + 10
        while True:
            try:
                kvarena.observe(self.socket).close()
                return
            except kvarena.KvarenaError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvarena-agent exited {self.proc.returncode}:\n{self.log}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kvarena-agent did not start:\n{self.log}")
            time.sleep(0.02)

    @property
    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """kvarena-ctl --socket ours ARGS."""
        r = subprocess.run([CTL, "--socket", self.socket, *args], capture_output=True,
                           text=True, timeout=30)
        if check and r.returncode != 0:
            raise AssertionError(f"kvarena-ctl {' '.join(args)} exited {r.returncode}:\n"
                                 f"{r.stdout}{r.stderr}")
        return r

    def status(self) -> dict:
        """kvarena-ctl --json status, as a dict."""
        return json.loads(self.ctl("--json", "status").stdout.splitlines()[0])

    def wait_idle(self, timeout: float = 10.0) -> dict:
        """Until no worker is left and every block is free or a cached prefix
        (the agent reclaimed whoever died); returns the last status."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if (st["workers"] == 0 and st["reclaims_pending"] == 0 and
                    st["free_blocks"] + st["prefix_cached_blocks"] == st["total_blocks"]):
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"the arena is not idle: {st}\n{self.log}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def agent() -> Iterator[Agent]:
    """An agent of 256 blocks (16 tokens x 2 layers x 2 kv heads x 64, f16)."""
    a = Agent()
    yield a
    a.cleanup()


@pytest.fixture
def make_agent() -> Iterator:
    """A factory of agents with flags of the test's choice; all stopped after."""
    made: list[Agent] = []

    def make(*args: str, env: Optional[dict] = None) -> Agent:
        a = Agent(args, env)
        made.append(a)
        return a

    yield make
    for a in made:
        a.cleanup()


@pytest.fixture
def worker(agent: Agent) -> Iterator[kvarena.Worker]:
    with kvarena.attach(agent.socket, "pytest") as w:
        yield w


def run_python(code: str, *args: str, env: Optional[dict] = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (this one's, with this
    environment): what a crash there does cannot take the tests down."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, *args],
                          capture_output=True, text=True, timeout=timeout, env=e)

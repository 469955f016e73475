# SPDX-License-Identifier: MIT
"""examples/engine.py runs: its own agent, several engine processes, prompts
with shared system prompts; it prints the reuse, and every reused block
held the K/V its publisher stored."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import AGENT, EXAMPLES


def test_example_engine_runs_and_reuses_prefixes():
    env = dict(os.environ)
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "engine.py"), "--agent", AGENT,
                        "--processes", "3", "--requests", "12", "--new-tokens", "4"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len([ln for ln in lines if ln.startswith("engine-")]) == 3
    total = next(ln for ln in lines if ln.startswith("total"))
    reuse = float(re.search(r"([\d.]+)%", total).group(1))
    assert reuse > 30, r.stdout           # three processes, six shared system prompts
    assert total.split()[-1] == "0"      # no bad reused block
    assert "arena check ok" in r.stdout

# SPDX-License-Identifier: MIT
"""What the metrics tests share: a real kvarena-agent with --metrics, its
scrapes parsed by prometheus_client's parser, kvarena-ctl's JSON, and worker
processes (metrics_worker) driven line by line."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

AGENT = os.environ.get("KVA_TEST_AGENT", "")
CTL = os.environ.get("KVA_TEST_CTL", "")
WORKER = os.environ.get("KVA_TEST_WORKER", "")
CUDASTUB_DIR = os.environ.get("KVA_TEST_CUDASTUB_DIR", "")
DASHBOARD = os.environ.get("KVA_TEST_DASHBOARD", "")

# the scraper's own source address: hostile clients in a test use others of
# 127/8, so the agent's per-address connection limit leaves it room (as a
# Prometheus server on another host has its own address)
SCRAPER = "127.0.0.2"


def eventually(check, timeout=5.0, every=0.1):
    """check() until it returns without AssertionError or OSError (a refused
    or timed-out scrape); after @timeout its last one is raised."""
    end = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (AssertionError, OSError):
            if time.monotonic() > end:
                raise
            time.sleep(every)


class Scrape:
    """One /metrics text: the parsed families, and lookups by labels."""

    def __init__(self, text):
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = [s for f in self.families.values() for s in f.samples]

    def find(self, metric, /, **labels):
        return [s for s in self.samples if s.name == metric and
                all(s.labels.get(k) == str(v) for k, v in labels.items())]

    def value(self, metric, /, **labels):
        found = self.find(metric, **labels)
        assert len(found) == 1, f"{metric}{labels}: {len(found)} samples"
        return found[0].value

    def names(self):
        return {s.name for s in self.samples}


class Agent:
    """kvarena-agent in a directory of its own, its log in agent.log."""

    def __init__(self, *args, metrics="0", env=None, wait=True, preexec_fn=None):
        self.dir = tempfile.mkdtemp(prefix="kvam-")
        os.chmod(self.dir, 0o755)  # a worker of another uid reaches the socket
        self.sock = os.path.join(self.dir, "agent.sock")
        self.log = os.path.join(self.dir, "agent.log")
        self.cmd = [AGENT, "--socket", self.sock, *args]
        if metrics is not None:
            self.cmd += ["--metrics", metrics]
        self.env = dict(os.environ, **(env or {}))
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=log,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         preexec_fn=preexec_fn)
        self.addr = None
        self.metrics = metrics not in (None, "off")
        if wait:
            self.wait_ready()

    def wait_ready(self, metrics=None):
        metrics = self.metrics if metrics is None else metrics
        end = time.monotonic() + 15
        while time.monotonic() < end:
            text = self.log_text()
            if "listening on" in text and os.path.exists(self.sock):
                break
            if self.proc.poll() is not None:
                raise AssertionError(f"the agent exited {self.proc.returncode}:\n{text}")
            time.sleep(0.02)
        else:
            raise AssertionError(f"the agent did not start:\n{self.log_text()}")
        m = re.search(r"metrics on http://(\S+)/metrics", self.log_text())
        if metrics:
            assert m, self.log_text()
            host, port = m.group(1).rsplit(":", 1)
            self.addr = (host.strip("[]"), int(port))
        else:
            assert not m, self.log_text()

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def request(self, method="GET", path="/metrics", source=SCRAPER, headers=None, body=None,
                timeout=5):
        """One request on a connection of its own: (status, headers, body)."""
        src = (source, 0) if source and ":" not in self.addr[0] else None
        c = http.client.HTTPConnection(self.addr[0], self.addr[1], timeout=timeout,
                                       source_address=src)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def scrape(self, source=SCRAPER):
        status, headers, body = self.request(source=source)
        assert status == 200, (status, body[:200])
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers
        return Scrape(body.decode())

    def ctl(self, command):
        r = subprocess.run([CTL, "--socket", self.sock, "--json", command],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (command, r.returncode, r.stdout, r.stderr)
        return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]

    def cpu_seconds(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, sig=signal.SIGTERM, timeout=20):
        """Signal, wait, check the log for sanitizer reports; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"the agent did not exit on {sig}:\n{self.log_text()}")
        text = self.log_text()
        assert "Sanitizer" not in text and "runtime error:" not in text, text
        return self.proc.returncode

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if os.environ.get("TU_KEEP_LOGS"):
            print(f"agent log kept: {self.log}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class Worker:
    """A metrics_worker process: commands in, one answer line each."""

    def __init__(self, agent, preexec_fn=None):
        self.proc = subprocess.Popen([WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1, preexec_fn=preexec_fn,
                                     env=dict(agent.env, KVARENA_SOCKET=agent.sock))
        self.pid = self.proc.pid

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def do(self, line):
        answer = self.send(line)
        assert answer.startswith("ok"), f"{line}: {answer}"
        return answer[3:]

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def agents():
    """Agents started by a test: stopped with SIGTERM at its end, which must
    exit 0 with no sanitizer report."""
    started = []
    workers = []

    def start(*args, wait=True, **kw):
        a = Agent(*args, wait=False, **kw)
        started.append(a)  # stopped at the end even if it never starts
        if wait:
            a.wait_ready()
        return a

    start.workers = workers
    yield start
    for w in workers:
        if w.proc.poll() is None:
            w.kill()
    try:
        for a in started:
            if a.proc.poll() is None:
                assert a.stop() == 0, a.log_text()
    finally:
        for a in started:
            a.cleanup()


@pytest.fixture
def worker(agents):
    def start(agent, **kw):
        w = Worker(agent, **kw)
        agents.workers.append(w)
        return w
    return start


def listening_tcp(pid):
    """The TCP sockets process @pid listens on: [(address, port)]."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", target)
        if m:
            inodes.add(m.group(1))
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                local = cols[1]
                found.append((local.rsplit(":", 1)[0], int(local.rsplit(":", 1)[1], 16)))
    return found


def have_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False

# SPDX-License-Identifier: MIT
"""kvarena-agent --metrics: the real agent, real scrapes, kvarena-ctl's view
of the same arena, promtool, the Grafana dashboard, hostile HTTP clients."""
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import (CUDASTUB_DIR, DASHBOARD, SCRAPER, Agent, Scrape, eventually,
                      have_ipv6_loopback, listening_tcp)


# ---------------------------------------------------------------- the flag


def test_off_by_default(agents):
    a = agents(metrics=None)
    assert listening_tcp(a.proc.pid) == [], "the agent listens on TCP without --metrics"
    assert "metrics" not in a.log_text()


BAD = [
    ("", "empty"),
    ("abc", "not a port"),
    ("65536", "out of range"),
    ("99999999", "out of range"),
    ("-1", "not a port"),
    ("localhost:9400", "not an IPv4 address"),
    ("::1:9400", "in brackets"),
    ("::1", "in brackets"),
    ("[::1]", "[ADDR]:PORT"),
    ("[::1]:", "no port"),
    ("[::1]9400", "[ADDR]:PORT"),
    ("[::1]:80x", "not a number"),
    ("[fe80::1%lo]:80", "zone"),
    ("[1.2.3.4]:80", "not an IPv6 address"),
    ("[zz]:80", "not an IPv6 address"),
    ("1.2.3.4", "not a port"),
    ("1.2.3.4:", "no port"),
    ("1.2.3.256:80", "not an IPv4 address"),
    ("1.2.3:80", "not an IPv4 address"),
    ("127.0.0.1:+80", "not a number"),
    ("127.0.0.1:0x50", "not a number"),
    ("127.0.0.1:123456", "out of range"),
    (" 9400", "not a port"),
    ("9400x", "not a port"),
]


@pytest.mark.parametrize("value,why", BAD)
def test_bad_value_refused_by_name(value, why, tmp_path):
    sock = tmp_path / "s.sock"
    r = subprocess.run([os.environ["KVA_TEST_AGENT"], "--socket", str(sock), "--metrics", value],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"--metrics {value}:" in r.stderr and why in r.stderr, r.stderr
    assert not sock.exists()


def test_config_file_key(tmp_path, agents):
    agent = os.environ["KVA_TEST_AGENT"]
    conf = tmp_path / "bad.conf"
    conf.write_text("# metrics\nmetrics = localhost:9400\n")
    r = subprocess.run([agent, "--socket", str(tmp_path / "s.sock"), "--config", str(conf)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--metrics localhost:9400:" in r.stderr, r.stderr
    assert f"(in {conf}, line 2)" in r.stderr, r.stderr
    conf.write_text("metrics = 0\nmetrics = 1\n")
    r = subprocess.run([agent, "--socket", str(tmp_path / "s.sock"), "--config", str(conf)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and '"metrics" given twice' in r.stderr, r.stderr
    # a good one serves; --metrics off on the command line wins over the file
    conf.write_text("metrics = 127.0.0.1:0\n")
    a = agents("--config", str(conf), metrics=None, wait=False)
    a.wait_ready(True)
    assert a.scrape().value("kvarena_blocks_capacity") > 0
    b = agents("--config", str(conf), metrics="off")
    assert listening_tcp(b.proc.pid) == []


def test_bind_failure_is_a_startup_error(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    sock = tmp_path / "s.sock"
    try:
        for value, why in ((f"127.0.0.1:{port}", "Address already in use"),
                           ("192.0.2.1:9400", "Cannot assign requested address")):
            r = subprocess.run([os.environ["KVA_TEST_AGENT"], "--socket", str(sock),
                                "--metrics", value], capture_output=True, text=True, timeout=30)
            assert r.returncode == 1, (r.returncode, r.stderr)
            assert f"--metrics {value}: cannot listen there: {why}" in r.stderr, r.stderr
            assert not sock.exists()
    finally:
        taken.close()


def test_port_forms(agents):
    a = agents(metrics="0")
    assert a.addr[0] == "127.0.0.1" and a.addr[1] > 0
    assert listening_tcp(a.proc.pid) == [("0100007F", a.addr[1])]
    if not have_ipv6_loopback():
        pytest.skip("no IPv6 loopback here: [::1] not tried")
    b = agents(metrics="[::1]:0")
    assert b.addr[0] == "::1" and f"metrics on http://[::1]:{b.addr[1]}/metrics" in b.log_text()
    assert b.scrape(source=None).value("kvarena_blocks_capacity") > 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", b.addr[1]), timeout=2).close()


def test_an_idle_agent_sleeps(agents):
    """Idle, with metrics on and a keep-alive scraper, the loop sleeps: its
    timer used to be left unread between two ticks (a busy loop of 7% of a
    CPU), and MHD's timeout asks for no wakeup when nothing is due."""
    a = agents()
    import http.client
    c = http.client.HTTPConnection(*a.addr, timeout=5, source_address=(SCRAPER, 0))
    c.request("GET", "/metrics")
    c.getresponse().read()
    time.sleep(0.5)
    c0, t0 = a.cpu_seconds(), time.monotonic()
    time.sleep(2)
    share = (a.cpu_seconds() - c0) / (time.monotonic() - t0)
    c.close()
    assert share < 0.03, f"an idle agent used {share:.1%} of a CPU"


# ---------------------------------------------------------------- the text


def raw_families(text):
    """{name: type} from the # TYPE lines; and every family has # HELP."""
    types, helps = {}, set()
    for line in text.splitlines():
        m = re.match(r"# (HELP|TYPE) (\S+) (.*)", line)
        if m and m.group(1) == "TYPE":
            assert m.group(2) not in types, f"two TYPE lines for {m.group(2)}"
            types[m.group(2)] = m.group(3)
        elif m:
            assert m.group(3).strip(), f"{m.group(2)}: empty HELP"
            helps.add(m.group(2))
    assert set(types) == helps, set(types) ^ helps
    return types


def check_conventions(scrape):
    types = raw_families(scrape.text)
    for name, kind in types.items():
        assert kind in ("counter", "gauge", "histogram"), (name, kind)
        assert name.startswith(("kvarena_", "process_")), name
        assert (kind == "counter") == name.endswith("_total"), (name, kind)
        if kind != "counter":
            assert not name.endswith(("_count", "_sum", "_bucket")), name
    for fam in scrape.families.values():
        assert fam.documentation, fam.name
        assert fam.type != "unknown", fam.name
    # every sample belongs to a family declared before it, and families are
    # not interleaved
    seen, current = set(), None
    for line in scrape.text.splitlines():
        if line.startswith("# TYPE "):
            current = line.split()[2]
            assert current not in seen
            seen.add(current)
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            assert name == current or (types[current] == "histogram" and name in (
                current + "_bucket", current + "_sum", current + "_count")), (name, current)


def promtool_check(text):
    promtool = shutil.which("promtool")
    if not promtool:
        return "promtool is not installed (Debian's prometheus package): not run"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), \
        (r.returncode, r.stdout, r.stderr)
    return None


@pytest.fixture
def busy(agents, worker):
    """An agent whose arena holds blocks in every state, two workers (one
    with a name that needs escaping), sequences of each kind, hits and
    misses, quotas and a tenant."""
    a = agents("--blocks", "512", "--worker-cache", "8", "--cache-limit", "100",
               "--quota-training", "50", "--tenant-quota", "7:300", "--tenant-quota", "9:10",
               "--evict-policy", "clock", "--name", "arena-t")
    w0 = worker(a)
    w0.do('attach eng"ine\\0')
    w0.do("own 5")
    w0.do("share 3")
    w0.do("publish 1 4")
    w0.do("hold 2 2 training")
    w0.do("hold 4 1 pinned")
    w1 = worker(a)
    w1.do("attach moteur-é")
    assert w1.do("match 1 4") == str(4 * 16)
    assert w1.do("match 3 2") == "0"
    w1.do("own 2")
    return a, w0, w1


def test_scrape_parses_and_follows_conventions(busy):
    a, _, _ = busy
    s = a.scrape()
    check_conventions(s)
    info = s.find("kvarena_agent_info")[0].labels
    assert info["arena"] == "arena-t" and info["backend"] == "host"
    assert info["evict_policy"] == "clock" and info["version"].count(".") == 1
    capacity = s.value("kvarena_blocks_capacity")
    assert capacity == 512
    assert sum(x.value for x in s.find("kvarena_blocks")) == capacity
    assert abs(s.value("kvarena_agent_start_time_seconds") - time.time()) < 120
    assert s.value("process_start_time_seconds") == s.value("kvarena_agent_start_time_seconds")
    assert s.value("process_open_fds") > 3


def test_promtool_check_metrics(busy):
    a, _, _ = busy
    why = promtool_check(a.scrape().text)
    if why:
        pytest.skip(why)


def test_values_match_kvarena_ctl(busy):
    a, w0, w1 = busy

    def same():
        s = a.scrape()
        st = a.ctl("status")[0]
        assert s.value("kvarena_blocks_capacity") == st["total_blocks"]
        assert s.value("kvarena_blocks", state="free") == st["free_blocks"]
        assert s.value("kvarena_blocks", state="owned") + \
            s.value("kvarena_blocks", state="cached_in_workers") == st["owned_blocks"]
        assert s.value("kvarena_blocks", state="cached_in_workers") == st["cached_blocks"]
        assert s.value("kvarena_blocks", state="shared") == st["shared_blocks"]
        assert s.value("kvarena_blocks", state="prefix_cached") == st["prefix_cached_blocks"]
        assert s.value("kvarena_shared_refs") == st["shared_refs"]
        assert s.value("kvarena_prefix_hits_total") == st["prefix_hits"]
        assert s.value("kvarena_prefix_misses_total") == st["prefix_misses"]
        assert s.value("kvarena_prefix_evictions_total", cause="pressure") == st["evictions"]
        assert s.value("kvarena_workers") == st["workers"] == 2
        assert sum(x.value for x in s.find("kvarena_worker_slots")) == st["max_workers"]
        assert s.value("kvarena_worker_slots", state="attached") == 2
        assert s.value("kvarena_block_bytes") == st["block_bytes"]
        assert s.value("kvarena_data_bytes") == st["data_bytes"]
        assert s.value("kvarena_meta_bytes") == st["meta_bytes"]
        assert s.value("kvarena_repairs_total") == st["repairs"]
        assert s.value("kvarena_reclaims_pending") == st["reclaims_pending"]
        assert s.value("kvarena_block_tokens") == st["geometry"]["block_tokens"]
        info = s.find("kvarena_agent_info")[0].labels
        assert info["dtype"] == st["geometry"]["dtype"] and info["layout"] == st["geometry"]["layout"]

        workers = a.ctl("workers")
        seqs = {q["slot"]: q for q in a.ctl("seqs")}
        assert len(s.find("kvarena_worker_info")) == len(workers) == 2
        for w in workers:
            lab = {"slot": str(w["slot"]), "pid": str(w["pid"])}
            info = s.find("kvarena_worker_info", **lab)
            assert len(info) == 1 and info[0].labels["state"] == "attached", info
            assert info[0].labels["uid"] == str(w["uid"])
            assert info[0].labels["name"] == w["name"]
            blocks = {x.labels["state"]: x.value for x in s.find("kvarena_worker_blocks", **lab)}
            assert blocks["owned"] + blocks["cached"] == w["owned"]
            assert blocks["cached"] == w["cached"] and blocks["shared"] == w["shared"]
            assert s.value("kvarena_worker_cache_refills_total", **lab) == w["refills"]
            assert s.value("kvarena_worker_cache_flushes_total", **lab) == w["flushes"]
            assert s.value("kvarena_worker_shares_total", **lab) == w["shares"]
            q = seqs[w["slot"]]
            assert s.value("kvarena_worker_sequences", **lab) == q["open_seqs"]
            for kind in ("inference", "training", "pinned"):
                assert s.value("kvarena_worker_sequence_blocks", kind=kind, **lab) == q[kind]
            assert s.value("kvarena_worker_prefix_hits_total", **lab) == q["hits"]
            assert s.value("kvarena_worker_prefix_misses_total", **lab) == q["misses"]
            assert s.value("kvarena_worker_prefix_published_total", **lab) == q["published"]
            assert s.value("kvarena_worker_prefix_evictions_total", **lab) == q["evictions"]

        p = a.ctl("prefix")[0]
        assert s.value("kvarena_prefix_index_capacity") == p["index_entries"]
        assert s.value("kvarena_prefix_index_entries", state="valid") == p["index_valid"]
        assert s.value("kvarena_prefix_index_entries", state="tombstone") == p["index_tombstones"]
        assert s.value("kvarena_prefix_index_entries", state="ghost") == p["index_ghosts"]
        assert s.value("kvarena_prefix_blocks", state="cached") == p["cached_blocks"]
        assert s.value("kvarena_prefix_blocks", state="held") == p["published_blocks"]
        assert s.value("kvarena_prefix_hits_total") == p["hits"]
        assert s.value("kvarena_prefix_misses_total") == p["misses"]
        assert s.value("kvarena_prefix_published_total") == p["published"]
        assert s.value("kvarena_prefix_duplicates_total") == p["duplicates"]
        assert s.value("kvarena_prefix_evictions_total", cause="pressure") == \
            p["evictions"]["pressure"]
        assert s.value("kvarena_prefix_evictions_total", cause="stale_entry") == \
            p["evictions"]["stale_entries"]
        assert s.value("kvarena_prefix_publish_skipped_total") == p["index_full"]
        assert s.value("kvarena_prefix_published_blocks") == p["published_now"]
        assert s.value("kvarena_prefix_cache_limit_blocks") == p["cache_limit"] == 100
        assert s.value("kvarena_sequences") == p["open_seqs"]
        for kind in ("inference", "training", "pinned"):
            assert s.value("kvarena_sequence_blocks", kind=kind) == p["usage"][kind]
            assert s.value("kvarena_sequence_quota_blocks", kind=kind) == p["quotas"][kind]
        tenants = {t["tenant"]: t for t in p["quotas"]["tenants"]}
        assert len(s.find("kvarena_tenant_quota_blocks")) == len(tenants) == 2
        for t, q in tenants.items():
            assert s.value("kvarena_tenant_quota_blocks", tenant=t) == q["blocks"]
            assert s.value("kvarena_tenant_blocks", tenant=t) == q["used"]
        return s

    s = eventually(same, timeout=5)
    # the state the workers made, seen through the metrics
    assert s.value("kvarena_prefix_hits_total") == 4
    assert s.value("kvarena_prefix_misses_total") >= 1
    assert s.value("kvarena_sequence_blocks", kind="training") == 2
    assert s.value("kvarena_tenant_blocks", tenant=7) > 0
    assert s.value("kvarena_blocks", state="shared") >= 3
    names = {x.labels["name"] for x in s.find("kvarena_worker_info")}
    assert names == {'eng"ine\\0', "moteur-é"}, names
    assert 'name="eng\\"ine\\\\0"' in s.text


def test_label_values_escaped_whatever_shared_memory_says(agents, worker):
    """A worker that joins on its own is named by its slot's name in shared
    memory, which the agent learns: any bytes. The text stays valid UTF-8,
    parses, and passes promtool; the name's printable part survives."""
    a = agents()
    w = worker(a)
    w.do("attach plain")
    evil = b'ev"il\\\n\xff\x01\x1b[2J}x="y'
    slot = w.do("join " + evil.hex())

    def learnt():
        s = a.scrape()
        info = s.find("kvarena_worker_info", slot=slot)
        assert len(info) == 1 and info[0].labels["state"] == "joined", info
        return s, info[0].labels["name"]

    s, name = eventually(learnt, timeout=3)
    assert name == 'ev"il\\????[2J}x="y', name
    s.text.encode("utf-8")
    check_conventions(s)
    why = promtool_check(s.text)
    if why:
        print(why)


# ---------------------------------------------------------------- workers come and go


def test_worker_series_come_and_go(agents, worker):
    a = agents("--blocks", "256")
    w = worker(a)
    slot = w.do("attach come-go")

    def present(name, pid):
        s = a.scrape()
        info = s.find("kvarena_worker_info", name=name)
        assert len(info) == 1 and info[0].labels["pid"] == str(pid), info
        return s

    def absent(name):
        s = a.scrape()
        assert not [x for x in s.samples if x.labels.get("name") == name], name
        return s

    s = eventually(lambda: present("come-go", w.pid), timeout=3)
    assert s.find("kvarena_worker_info", name="come-go")[0].labels["slot"] == slot
    w.do("detach")
    eventually(lambda: absent("come-go"), timeout=3)

    v = worker(a)
    v.do("attach victim")
    v.do("own 10")
    v.do("share 2")
    eventually(lambda: present("victim", v.pid), timeout=3)
    before = a.scrape().value("kvarena_reclaims_total")
    v.kill()

    def reclaimed():
        s = absent("victim")
        assert s.value("kvarena_reclaims_total") == before + 1
        assert s.value("kvarena_reclaimed_blocks_total") >= 12
        assert s.value("kvarena_blocks", state="free") == 256
        return s

    s = eventually(reclaimed, timeout=5)
    assert s.value("kvarena_workers") == 0
    assert s.find("kvarena_worker_blocks") == []
    assert s.value("kvarena_admitted_total") == 2


# ---------------------------------------------------------------- refusals


def test_refusals_counted_by_reason(agents, worker):
    a = agents("--max-workers", "2", "--max-slots-per-pid", "1", "--hello-timeout", "0.3",
               "--socket-mode", "0666", "--allow-uid", str(os.geteuid()))
    expect = {}
    w0 = worker(a)
    w0.do("attach first")
    assert w0.send("attach again").startswith("err -122"), "not over --max-slots-per-pid"
    expect["slot_limit"] = 1
    w1 = worker(a)
    w1.do("attach second")
    w2 = worker(a)
    assert w2.send("attach third").startswith("err -87"), "the arena was not full"
    expect["full"] = 1
    junk = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    junk.connect(a.sock)
    junk.send(b"\x01\x02\x03")
    assert junk.recv(4096), "no REFUSE for junk"
    junk.close()
    expect["protocol"] = 1
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    silent.connect(a.sock)
    silent.settimeout(5)
    assert silent.recv(4096), "no REFUSE for a silent connection"
    silent.close()
    expect["hello_timeout"] = 1
    if os.geteuid() == 0:
        def nobody():
            os.setgid(65534)
            os.setuid(65534)
        w3 = worker(a, preexec_fn=nobody)
        assert w3.send("attach nobody").startswith("err -13"), "nobody was not refused"
        expect["not_allowed"] = 1

    def counted():
        s = a.scrape()
        for sample in s.find("kvarena_refused_total"):
            assert sample.value == expect.get(sample.labels["reason"], 0), sample
        assert s.value("kvarena_agent_log_messages_total", level="warn") >= sum(expect.values())
        assert s.value("kvarena_agent_log_messages_total", level="error") == 0
        return s

    eventually(counted, timeout=3)
    assert a.log_text().count("refused pid") == sum(expect.values())


# ---------------------------------------------------------------- tiers


def test_tier_metrics_match_kvarena_ctl(agents, worker, tmp_path):
    a = agents("--blocks", "128", "--host-bytes", "8M", "--disk-dir", str(tmp_path),
               "--disk-bytes", "16M")
    w = worker(a)
    w.do("attach tiered")
    w.do("publish 11 8")
    w.do("backed 8")
    w.do("evict")
    fetched = int(w.do("fetch 11 8"))
    assert fetched > 0

    def same():
        s = a.scrape()
        t = a.ctl("tiers")[0]
        for tier in ("host", "disk"):
            c = t[tier]
            assert c["enabled"]
            for metric, field in (("kvarena_tier_capacity_records", "capacity_records"),
                                  ("kvarena_tier_records", "used_records"),
                                  ("kvarena_tier_record_bytes", "record_bytes"),
                                  ("kvarena_tier_capacity_bytes", "capacity_bytes"),
                                  ("kvarena_tier_used_bytes", "used_bytes"),
                                  ("kvarena_tier_hits_total", "hits"),
                                  ("kvarena_tier_records_written_total", "records_in"),
                                  ("kvarena_tier_written_bytes_total", "bytes_in"),
                                  ("kvarena_tier_read_bytes_total", "bytes_out"),
                                  ("kvarena_tier_io_errors_total", "io_errors"),
                                  ("kvarena_tier_verify_failures_total", "verify_failed"),
                                  ("kvarena_tier_stale_total", "stale"),
                                  ("kvarena_tier_dropped_records_total", "dropped")):
                assert s.value(metric, tier=tier) == c[field], (metric, tier)
            assert s.value("kvarena_tier_degraded", tier=tier) == int(c["degraded"])
            assert s.value("kvarena_tier_fetch_p50_seconds", tier=tier) == \
                pytest.approx(c["fetch_p50_us"] / 1e6)
            assert s.value("kvarena_tier_fetch_p99_seconds", tier=tier) == \
                pytest.approx(c["fetch_p99_us"] / 1e6)
        disk = s.find("kvarena_tier_info", tier="disk")[0].labels
        assert disk["path"] == t["disk"]["path"]
        assert disk["io"] == ("direct" if t["disk"]["direct"] else "buffered")
        assert s.value("kvarena_tier_backed_blocks_total") == t["backed"]
        assert s.value("kvarena_tier_back_skipped_blocks_total") == t["back_skipped"]
        assert s.value("kvarena_tier_unbacked_evictions_total") == t["unbacked_evictions"]
        assert s.value("kvarena_tier_found_blocks_total") == t["below_found"]
        assert s.value("kvarena_tier_fetched_blocks_total", result="ok") == t["fetched"]
        assert s.value("kvarena_tier_fetched_blocks_total", result="failed") == t["fetch_failed"]
        assert s.value("kvarena_tier_fetch_requests_total") == t["fetch_requests"]
        assert s.value("kvarena_tier_index_entries", tier="host") == t["spilled_host"]
        assert s.value("kvarena_tier_index_entries", tier="disk") == t["spilled_disk"]
        return s

    s = eventually(same, timeout=10, every=0.3)
    check_conventions(s)
    assert s.value("kvarena_tier_backed_blocks_total") >= 8
    assert s.value("kvarena_tier_fetched_blocks_total", result="ok") * 16 == fetched
    # the host tier's histogram: cumulative, +Inf = count = the host hits
    buckets = sorted(((float(x.labels["le"]), x.value)
                      for x in s.find("kvarena_tier_fetch_duration_seconds_bucket")))
    assert buckets[-1][0] == float("inf")
    assert all(a_[1] <= b_[1] for a_, b_ in zip(buckets, buckets[1:])), buckets
    count = s.value("kvarena_tier_fetch_duration_seconds_count", tier="host")
    assert buckets[-1][1] == count == s.value("kvarena_tier_hits_total", tier="host")
    assert count == 0 or s.value("kvarena_tier_fetch_duration_seconds_sum", tier="host") > 0
    assert s.value("kvarena_worker_slots", state="agent") == 1
    assert s.find("kvarena_worker_info", name="agent (tiers)", state="agent")
    why = promtool_check(s.text)
    if why:
        print(why)


# ---------------------------------------------------------------- GPU arena


def stand_in():
    # meson builds the stand-in before this suite and says where
    lib = os.path.join(CUDASTUB_DIR, "libcuda.so.1")
    assert CUDASTUB_DIR and os.path.exists(lib), f"no CUDA driver stand-in at {lib!r}"
    return {"LD_LIBRARY_PATH": CUDASTUB_DIR, "KVA_CUDASTUB_STRICT": "1",
            "KVA_CUDASTUB_GRANULARITY": "65536", "KVA_CUDASTUB_MEMORY": "1G"}


def test_gpu_arena_device_memory(agents):
    a = agents("--backend", "cuda", "--blocks", "64", env=stand_in())

    def same():
        s = a.scrape()
        st = a.ctl("status")[0]
        assert st["device_total_bytes"] > 0
        assert s.value("kvarena_device_memory_bytes", state="total") == st["device_total_bytes"]
        assert s.value("kvarena_device_memory_bytes", state="free") == st["device_free_bytes"]
        info = s.find("kvarena_agent_info")[0].labels
        assert info["backend"] == "cuda"
        assert info["device"] == st["device_name"] and info["device_uuid"] == st["device_uuid"]
        return s

    s = eventually(same, timeout=5)
    check_conventions(s)
    assert a.stop() == 0, a.log_text()  # strict stand-in: nothing left behind


# ---------------------------------------------------------------- the dashboard


def exported_names(agents, worker, tmp_path):
    """Every sample name the agent exports: a host arena with tiers and
    workers, and a GPU arena over the driver stand-in."""
    a = agents("--blocks", "128", "--host-bytes", "8M", "--disk-dir", str(tmp_path),
               "--disk-bytes", "16M", "--tenant-quota", "7:100")
    w = worker(a)
    w.do("attach dash")
    w.do("hold 5 1 inference")
    names = a.scrape().names()
    g = agents("--backend", "cuda", "--blocks", "64", env=stand_in())
    return names | g.scrape().names()


PROMQL_WORDS = {"sum", "avg", "min", "max", "count", "topk", "bottomk", "quantile", "stddev",
                "stdvar", "group", "and", "or", "unless", "offset", "bool", "group_left",
                "group_right"}


def metric_names(expr):
    """The metric names a PromQL expression reads: identifiers outside
    braces, strings and ranges, not functions, aggregations, keywords or
    the label lists of by/on/ignoring."""
    bare = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]', " ", expr)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    return {m.group(1) for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare)
            if m.group(1) not in PROMQL_WORDS and not re.fullmatch(r"[0-9.e]+", m.group(1))}


@pytest.fixture
def exported(agents, worker, tmp_path):
    return exported_names(agents, worker, tmp_path)


def test_grafana_dashboard(exported):
    with open(DASHBOARD) as f:
        d = json.load(f)
    assert d["schemaVersion"] >= 36 and d["title"] and d["uid"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "arena"):
        assert variables[name]["type"] == "query", name
        assert "kvarena_agent_info" in variables[name]["query"]["query"]

    panels = []
    for p in d["panels"]:
        panels.append(p)
        panels += p.get("panels", [])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    used = set()
    for p in panels:
        assert p["gridPos"]["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            expr = t["expr"]
            assert 'instance=~"$instance"' in expr, (p["title"], expr)
            for name in metric_names(expr):
                assert name in exported, f"{p['title']}: {name} is not exported ({expr})"
                used.add(name)
    for family in ("kvarena_blocks", "kvarena_prefix_hits_total", "kvarena_prefix_misses_total",
                   "kvarena_prefix_evictions_total", "kvarena_workers",
                   "kvarena_worker_blocks", "kvarena_reclaims_total", "kvarena_refused_total",
                   "kvarena_tier_used_bytes", "kvarena_tier_hits_total",
                   "kvarena_tier_written_bytes_total", "kvarena_tier_io_errors_total",
                   "kvarena_tier_degraded", "kvarena_device_memory_bytes"):
        assert family in used, f"the dashboard does not show {family}"


def test_prometheus_alert_rules(exported):
    rules = os.path.join(os.path.dirname(os.path.dirname(DASHBOARD)), "prometheus",
                         "kvarena-alerts.yml")
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr)
    else:
        print("promtool is not installed: the rules file is not checked by it")
    with open(rules) as f:
        text = f.read()
    exprs = re.findall(r"expr: \|\n((?:\s{10}.*\n)+)|expr: (.*)\n", text)
    assert len(exprs) >= 5
    for block, line in exprs:
        for name in metric_names(block or line):
            assert name in exported, f"{name} is not exported ({block or line})"


# ---------------------------------------------------------------- HTTP


def raw(addr, data, source="127.0.0.5", timeout=5, read=True):
    """Send @data on a connection of its own; what came back before EOF."""
    s = socket.socket()
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(addr)
    try:
        s.sendall(data)
    except OSError:
        pass  # answered and closed before everything went
    out = b""
    try:
        while read:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    s.close()
    return out


def test_methods_paths_and_bodies(agents):
    a = agents()
    status, headers, body = a.request("HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 1000
    assert a.request("GET", "/metrics?x=1")[0] == 200
    assert a.request("GET", "/")[0] == 404
    assert a.request("GET", "/metricsx")[0] == 404
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
        status, headers, _ = a.request(method, body=b"x" * 10)
        assert status == 405 and headers["Allow"] == "GET, HEAD", (method, status)
    assert raw(a.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")\
        .startswith(b"HTTP/1.1 413")
    assert raw(a.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n0\r\n\r\n").startswith(b"HTTP/1.1 413")
    assert raw(a.addr, b"GET /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200")
    # a POST of a megabyte: answered without the body being read, closed
    t0 = time.monotonic()
    reply = raw(a.addr, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n" +
                b"x" * 1048576)
    assert reply.startswith(b"HTTP/1.1 405") and time.monotonic() - t0 < 5
    # keep-alive: scrapes on one connection
    import http.client
    c = http.client.HTTPConnection(*a.addr, timeout=5, source_address=(SCRAPER, 0))
    for _ in range(5):
        c.request("GET", "/metrics")
        r = c.getresponse()
        assert r.status == 200 and r.read()
    c.close()
    s = eventually(lambda: check_answers(a), timeout=3)
    assert s.value("kvarena_metrics_requests_total", code="405") >= 5


def check_answers(a):
    s = a.scrape()
    assert s.value("kvarena_metrics_requests_total", code="404") >= 2
    assert s.value("kvarena_metrics_requests_total", code="413") >= 2
    return s


def test_text_made_at_most_once_a_second(agents):
    a = agents("--blocks", "4096")
    import http.client
    c = http.client.HTTPConnection(*a.addr, timeout=5, source_address=(SCRAPER, 0))
    first = a.scrape().value("kvarena_metrics_renders_total")
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < 2.0:
        c.request("GET", "/metrics")
        r = c.getresponse()
        assert r.status == 200
        r.read()
        n += 1
    c.close()
    time.sleep(1.1)
    renders = a.scrape().value("kvarena_metrics_renders_total") - first
    assert n > 50 and renders <= 4, (n, renders)


# ---------------------------------------------------------------- hostile


class Slowloris(threading.Thread):
    """A request sent a byte at a time, slower than anyone waits for."""

    def __init__(self, addr, source):
        super().__init__(daemon=True)
        self.addr, self.source = addr, source
        self.cut_after = None
        self.stop = threading.Event()

    def run(self):
        s = socket.socket()
        s.bind((self.source, 0))
        s.connect(self.addr)
        t0 = time.monotonic()
        data = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 1000
        try:
            for b in data:
                if self.stop.is_set():
                    break
                s.send(bytes([b]))
                time.sleep(0.5)
                s.settimeout(0.01)
                try:
                    if s.recv(1) == b"":
                        break
                except socket.timeout:
                    pass
        except OSError:
            pass
        self.cut_after = time.monotonic() - t0
        s.close()


def silent_flood(addr, n, sources):
    """@n connections that send nothing, from @sources in turn."""
    socks = []
    for k in range(n):
        s = socket.socket()
        s.bind((sources[k % len(sources)], 0))
        s.setblocking(False)
        try:
            s.connect(addr)
        except BlockingIOError:
            pass
        socks.append(s)
    return socks


def churn_workers(a, worker, n, tag):
    """@n workers attach and take blocks; every other one is SIGKILLed (the
    agent reclaims it), the rest detach."""
    for k in range(n):
        w = worker(a)
        w.do(f"attach {tag}-{k}")
        w.do("own 3")
        if k % 2:
            w.kill()
        else:
            w.close()


def test_hostile_clients(agents, worker):
    a = agents("--blocks", "1024")
    addr = a.addr
    # 200 connections that send nothing, from one address (the agent holds
    # 8 of them, 5 s each), and slowloris requests from another
    silent = silent_flood(addr, 200, ["127.0.0.3"])
    slow = [Slowloris(addr, "127.0.0.4") for _ in range(6)]
    for t in slow:
        t.start()

    stop = threading.Event()
    replies = {}

    def garbage(source, seed):
        rng = random.Random(seed)
        k = 0
        while not stop.is_set():
            kind = k % 6
            k += 1
            if kind == 0:
                data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000)))
            elif kind == 1:
                data = b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
            elif kind == 2:
                data = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + \
                    b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(2000)) + b"\r\n"
            elif kind == 3:
                data = b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + \
                    b"y" * 200000
            elif kind == 4:
                data = b"GARBAGE\r\n\r\n\x00\xff\xfe"
            else:
                data = b"GET /metrics HTTP/1.1\r\nHost: \x00\x01\r\nX: \xff\r\n\r\n"
            try:
                reply = raw(addr, data, source=source, timeout=1)
            except OSError as e:
                reply = repr(e).encode()
            replies.setdefault(kind, []).append(reply[:12])

    flood = [threading.Thread(target=garbage, args=(f"127.0.0.{5 + k}", k), daemon=True)
             for k in range(3)]
    for g in flood:
        g.start()
    try:
        time.sleep(1.0)
        # scrapes answered and the CPU low over 2 s, the flood going on
        c0, t0 = a.cpu_seconds(), time.monotonic()
        scrapes = 0
        while time.monotonic() - t0 < 2.0:
            assert a.scrape().value("kvarena_blocks_capacity") == 1024
            scrapes += 1
            time.sleep(0.2)
        share = (a.cpu_seconds() - c0) / (time.monotonic() - t0)
        print(f"agent CPU under the flood: {share:.1%} of a CPU, {scrapes} scrapes")
        assert share < 0.20, f"the agent used {share:.0%} of a CPU under the flood"
        # the agent goes on admitting and reclaiming
        churn_workers(a, worker, 10, "flood")
        eventually(lambda: reclaims(a, 5), timeout=5)
        # the slowloris connections are cut at their deadline (10 s)
        deadline = time.monotonic() + 20
        while any(t.is_alive() for t in slow) and time.monotonic() < deadline:
            assert a.scrape().value("kvarena_blocks_capacity") == 1024
            time.sleep(0.5)
        assert not any(t.is_alive() for t in slow), "a slowloris is still connected after 20 s"
        assert all(t.cut_after < 16 for t in slow), [t.cut_after for t in slow]
    finally:
        stop.set()
        for g in flood:
            g.join(10)
        for t in slow:
            t.stop.set()
        for s in silent:
            s.close()
    s = a.scrape()
    print({k: sorted(set(v)) for k, v in replies.items()}, {k: len(v) for k, v in replies.items()})
    assert s.value("kvarena_metrics_connections_cut_total") >= 1
    assert s.value("kvarena_admitted_total") == 10
    assert s.value("kvarena_agent_log_messages_total", level="error") == 0
    assert s.value("kvarena_agent_log_messages_total", level="warn") == 0
    # what the garbage got: an HTTP error or a closed connection, never a 200
    # (kind 5 is a GET of /metrics, its odd header bytes are MHD's to judge)
    for kind, got in replies.items():
        if kind == 5:
            continue
        assert not [r for r in got if r.startswith(b"HTTP/1.1 200")], (kind, got[:5])
    assert any(r.startswith(b"HTTP/1.1 405") for r in replies.get(3, [])), replies.get(3, [])[:5]
    assert any(r.startswith(b"HTTP/1.1 414") for r in replies.get(1, [])), replies.get(1, [])[:5]
    assert any(r.startswith(b"HTTP/1.1 431") for r in replies.get(2, [])), replies.get(2, [])[:5]
    log = a.log_text()
    assert " error: " not in log and " warn: " not in log, log[-3000:]


def test_connection_flood_from_many_addresses(agents, worker):
    """Silent connections from 50 addresses take every connection the
    metrics server has (32): scrapes wait while they last, the agent's own
    work does not, and the server takes connections again when they end."""
    a = agents("--blocks", "1024")
    silent = silent_flood(a.addr, 200, [f"127.0.0.{10 + k}" for k in range(50)])
    try:
        time.sleep(0.5)
        c0, t0 = a.cpu_seconds(), time.monotonic()
        churn_workers(a, worker, 6, "busy")
        # seen by kvarena-ctl: the metrics port is full

        def reclaimed():
            assert a.ctl("status")[0]["workers"] == 0
            assert a.log_text().count(" died holding slot ") == 3
        eventually(reclaimed, timeout=5)
        time.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))
        share = (a.cpu_seconds() - c0) / (time.monotonic() - t0)
        print(f"agent CPU, metrics port full: {share:.1%} of a CPU")
        assert share < 0.20, f"the agent used {share:.0%} of a CPU"
        # held connections idle out after 5 s, the next ones are accepted
        # from the queue: still none that sends anything
        time.sleep(6)
        assert listening_tcp(a.proc.pid), "the metrics port is gone"
    finally:
        for s in silent:
            s.close()
    s = eventually(lambda: a.scrape(), timeout=12, every=0.5)
    assert s.value("kvarena_admitted_total") == 6
    assert s.value("kvarena_reclaims_total") == 3
    assert s.value("kvarena_agent_log_messages_total", level="warn") == 0


def test_out_of_descriptors_is_no_busy_loop(agents):
    """Out of descriptors, with connections waiting on the metrics port and
    none open: libmicrohttpd retries accept() at every run; the agent does
    not let it spin its loop, and serves again when descriptors are back."""
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    a = agents("--hello-timeout", "10", "--max-pending-per-uid", "100", preexec_fn=low_limit)
    unix = []
    for _ in range(80):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.setblocking(False)
        try:
            s.connect(a.sock)
        except OSError:
            pass
        unix.append(s)
    time.sleep(0.5)
    tcp = silent_flood(a.addr, 3, ["127.0.0.20", "127.0.0.21", "127.0.0.22"])
    try:
        time.sleep(0.5)
        c0, t0 = a.cpu_seconds(), time.monotonic()
        time.sleep(2)
        share = (a.cpu_seconds() - c0) / (time.monotonic() - t0)
        print(f"agent CPU out of descriptors: {share:.1%} of a CPU")
        assert share < 0.20, f"the agent used {share:.0%} of a CPU out of descriptors"
    finally:
        for s in unix + tcp:
            s.close()
    s = eventually(lambda: a.scrape(), timeout=10, every=0.5)
    assert s.value("kvarena_metrics_pauses_total") >= 1
    assert "Too many open files" in a.log_text()


def reclaims(a, n):
    s = a.scrape()
    assert s.value("kvarena_reclaims_total") == n
    assert s.value("kvarena_workers") == 0
    return s


# ---------------------------------------------------------------- stopping


def test_sigterm_with_metrics_exits_0(agents, worker):
    a = agents("--shutdown-grace", "2")
    w = worker(a)
    w.do("attach leaving")
    w.do("own 4")
    idle = socket.create_connection(a.addr, timeout=5)             # keep-alive, idle
    half = socket.create_connection(a.addr, timeout=5)
    half.sendall(b"GET /metrics HTTP/1.1\r\nHost")                  # half a request
    a.scrape()
    assert a.stop() == 0, a.log_text()
    assert w.proc.stdout.readline().strip() == "shutdown"
    with pytest.raises(OSError):
        socket.create_connection(a.addr, timeout=2).close()
    idle.close()
    half.close()

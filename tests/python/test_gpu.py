# SPDX-License-Identifier: MIT
"""A GPU arena, over the project's CUDA driver stand-in (tests/cudastub):
numpy views are refused with a clear error, device pointers are given as
ints, block_read / block_write copy, sequences (a fork's device copy
included) work, and the Python process never touches device memory with
the CPU (KVA_CUDASTUB_NO_CPU: a touch would be a crash) nor leaves device
memory behind (KVA_CUDASTUB_STRICT: exit 87 or 88)."""
from __future__ import annotations

import os

import pytest

from conftest import run_python

STUB = os.environ.get("KVARENA_CUDASTUB_DIR")

CODE = r"""
import sys, numpy as np, kvarena
w = kvarena.attach(sys.argv[1], "gpu-py")
assert w.info.backend is kvarena.Backend.CUDA and w.info.device_uuid.startswith("GPU-")
ids = w.alloc(3)
for call in (lambda: w.block_kv(ids[0], 0), lambda: w.kv_cache(1)):
    try:
        call()
        raise SystemExit("a numpy view of device memory was made")
    except kvarena.NotSupported as e:
        assert "GPU memory" in str(e), e
k, v = w.block_kv_ptr(ids[1], 1)
assert k and v and v - k == w.info.layout.page_bytes
desc = w.kv_desc(1)
assert desc.device and desc.pointers[0] == w.block_kv_ptr(0, 1)[0]
q = np.zeros((1, 4, 64), np.float32)
pt = kvarena.PageTable([0, 1], [ids[0]], [1], 16)
for call in (lambda: w.decode(1, q, pt),
             lambda: w.store_kv(1, q[:, :2], q[:, :2], np.zeros(1, np.int64))):
    try:
        call()
        raise SystemExit("a CPU kernel ran over device memory")
    except kvarena.NotSupported as e:
        assert "GPU memory" in str(e), e
data = bytes(range(256)) * (w.info.block_bytes // 256)
w.block_write(ids[2], 0, data)
assert w.block_read(ids[2]) == data
assert w.block_read(ids[2], 1000, 5) == data[1000:1005]
with w.open_seq(model="gpu") as s:
    s.append(list(range(40)))
    with s.fork() as c:
        c.append([1])                      # the partial block copied on the device
        assert c.block_table()[0][2] != s.block_table()[0][2]
with w.open_seq(model="gpu") as s:
    assert s.match(list(range(40))) == 32
w.free(ids)
assert w.check().ok
w.detach()
print("gpu ok")
"""


@pytest.mark.parametrize("ipc", ["fd", "legacy"])
def test_gpu_arena_over_the_stand_in(make_agent, ipc):
    # meson builds the stand-in and sets its directory for this suite
    assert STUB, "KVARENA_CUDASTUB_DIR not set (the driver stand-in): run through meson test"
    paths = [STUB] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(paths),
               KVA_CUDASTUB_STRICT="1", KVA_CUDASTUB_GRANULARITY="65536",
               KVA_CUDASTUB_MEMORY="1G", KVA_CUDASTUB_NO_CPU="1")
    a = make_agent("--backend", "cuda", "--memory", "8M", "--ipc", ipc, env=env)
    r = run_python(CODE, a.socket, env=env)
    assert r.returncode == 0, (f"exit {r.returncode} (87: device memory left behind, 88: the "
                               f"driver API's contract broken, <0: a signal)\n{r.stdout}{r.stderr}")
    assert "gpu ok" in r.stdout
    a.wait_idle()

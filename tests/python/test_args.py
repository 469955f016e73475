# SPDX-License-Identifier: MIT
"""Bad arguments: each raises the right exception, and none crashes the
interpreter (the cases run in a process of their own: nasty.py)."""
from __future__ import annotations

import errno
import os
import signal

import pytest

import kvarena
from conftest import HERE, run_python


def test_bad_arguments_raise_and_never_crash(agent):
    r = run_python(f"import sys; sys.path.insert(0, {str(HERE)!r}); import nasty; "
                   f"sys.exit(nasty.main({agent.socket!r}))")
    assert r.returncode >= 0, (f"the interpreter died of signal {-r.returncode} "
                               f"({signal.Signals(-r.returncode).name}):\n{r.stdout}\n{r.stderr}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cases raised what they should" in r.stdout
    agent.wait_idle()


def test_errors_carry_errno_message_and_function(worker):
    with pytest.raises(kvarena.KvarenaError) as e:
        worker.free([0, 0])
    err = e.value
    assert isinstance(err, OSError) and isinstance(err, kvarena.NotPermitted)
    assert err.errno == errno.EPERM and err.function == "kva_free"
    assert "not held" in err.strerror and "[EPERM]" in str(err)
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError too
        worker.alloc(-1)
    # picklable (multiprocessing sends exceptions between processes)
    import pickle
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and again.errno == err.errno and str(again) == str(err)


def test_library_refuses_a_wrong_path():
    r = run_python("import kvarena\n"
                   "try:\n    kvarena.load_library()\nexcept kvarena.LibraryError as e:\n"
                   "    print('refused:', e)\n",
                   env={"KVARENA_LIB": "/nonexistent/libkvarena.so"})
    assert r.returncode == 0 and "refused:" in r.stdout and "no such file" in r.stdout


def test_library_loaded_and_checked():
    path = kvarena.library_path()
    assert os.path.exists(path) or "libkvarena" in path
    assert kvarena.kernel_threads() >= 1
    assert kvarena.isa_best() in ("scalar", "avx2", "avx512")


def test_a_library_of_another_layout_is_refused():
    code = (
        "import ctypes, kvarena._abi as A\n"
        "class kva_stats(ctypes.Structure):\n"
        "    _fields_ = [('total_blocks', ctypes.c_uint32)]\n"
        "A.CHECKED = A.CHECKED + (kva_stats,)\n"
        "import kvarena\n"
        "try:\n"
        "    kvarena.load_library()\n"
        "except kvarena.LibraryError as e:\n"
        "    print('refused:', e)\n")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "struct kva_stats" in r.stdout
    assert "4 in the binding" in r.stdout


def test_a_second_library_is_refused():
    kvarena.load_library()  # the same one again: fine
    with pytest.raises(kvarena.LibraryError):
        kvarena.load_library("/somewhere/else/libkvarena.so")


def test_handles_cannot_be_pickled_or_made(worker):
    import pickle
    with worker.open_seq() as s:
        for obj in (worker, s, worker.kv_desc(0)):
            with pytest.raises(TypeError):
                pickle.dumps(obj)
    for cls in (kvarena.Worker, kvarena.Seq, kvarena.KVDesc, kvarena.Observer):
        with pytest.raises(TypeError):
            cls()

"""The compile workers a background lane build starts: at the lower priority, the caller's own unchanged."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")


def test_compile_workers_start_at_the_lower_priority_and_the_caller_keeps_its_own():
    """Inductor's pool (its sidecar process) runs at the nice value asked; the thread that asked does not."""
    probe = textwrap.dedent("""
        import os
        from engine.backends.compile_pool import start_compile_pool
        from torch._inductor import config
        config.compile_threads = 2  # a pool even on a one-core runner
        before = os.getpriority(os.PRIO_PROCESS, 0)
        print(start_compile_pool(nice=before + 7), before, os.getpriority(os.PRIO_PROCESS, 0))
        me = str(os.getpid())
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:  # state, ppid, ... nice is the 19th field of stat, the 17th after the name
                print("child", fields[16])
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    started, before, after = lines[0].split()
    assert started == "True" and before == after
    children = [int(line.split()[1]) for line in lines[1:] if line.startswith("child")]
    assert children and all(nice == int(before) + 7 for nice in children)


def test_one_compile_thread_starts_no_pool(monkeypatch):
    from torch._inductor import async_compile

    from engine.backends.compile_pool import start_compile_pool

    monkeypatch.setattr(async_compile, "get_compile_threads", lambda: 1)
    assert start_compile_pool() is False


def test_a_pool_that_cannot_start_is_no_error(monkeypatch):
    """Inductor failing to start its workers leaves the compile as it was (its pool started on first use), and
    nothing escapes the throwaway thread to be printed as its traceback."""
    import threading

    from torch._inductor import async_compile

    from engine.backends.compile_pool import start_compile_pool

    def broken() -> None:
        raise OSError("no subprocess here")

    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    monkeypatch.setattr(async_compile, "get_compile_threads", lambda: 2)
    monkeypatch.setattr(async_compile.AsyncCompile, "warm_pool", broken)
    assert start_compile_pool() is False
    assert escaped == []

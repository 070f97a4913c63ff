"""cudalab/interrupts.py: a second Ctrl-C cannot cut short the cleanup the first one began
(cancelling the run's jobs, removing the doctors' flags)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cudalab.interrupts import OnceInterrupt


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_first_sigint_stops_repeats_within_the_grace_only_say_so_then_one_forces():
    clock, said, shielded = Clock(), [], []
    h = OnceInterrupt(grace_s=20, emit=said.append, clock=clock,
                      shield=lambda: shielded.append(clock.t))
    with pytest.raises(KeyboardInterrupt):
        h(signal.SIGINT, None)
    assert shielded == [100.0], "the commands the cleanup starts ignore the repeats"
    clock.t += 0.001  # `timeout -s INT` sends it to the command and to its process group
    h(signal.SIGINT, None)
    clock.t += 5
    h(signal.SIGINT, None)
    assert h.ignored == 2 and len(said) == 2
    assert "stopping" in said[-1] and "15 s" in said[-1] and "squeue --me" in said[-1]
    clock.t += 16  # past the grace: the user means it
    with pytest.raises(KeyboardInterrupt):
        h(signal.SIGINT, None)


CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from cudalab import interrupts
    if sys.argv[1] == "guarded":
        interrupts.install(grace_s=10)
    try:
        print("ready", flush=True)
        time.sleep(30)
    except KeyboardInterrupt:
        print("stopping", flush=True)
        time.sleep(1.0)  # the cleanup (scancel, the doctors' flags) the second Ctrl-C hits
        print("cleaned up", flush=True)
""")


@pytest.mark.parametrize("mode", ["guarded", "default"])
def test_a_real_second_sigint_during_the_cleanup(mode):
    """Two real SIGINTs, the second while the first's cleanup runs: Python's default
    handler cuts the cleanup short (the CI failure); the installed one lets it finish."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().strip() == "stopping"
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    if mode == "guarded":
        assert "cleaned up" in out and proc.returncode == 0, (out, err)
        assert "cudalab: stopping" in err and "KeyboardInterrupt" not in err, err
    else:
        assert "cleaned up" not in out and "KeyboardInterrupt" in err, (out, err)


SHIELDED = textwrap.dedent("""
    import subprocess, sys, time
    from cudalab import interrupts
    interrupts.install(grace_s=10)
    try:
        print("ready", flush=True)
        time.sleep(30)
    except KeyboardInterrupt:
        print("stopping", flush=True)
        # as the plugin's scancel: a command the cleanup starts (no shell between: dash
        # unblocks every signal as it starts)
        out = subprocess.run([sys.executable, "-c",
                              "import time; time.sleep(1); print('scancel done')"],
                             text=True, capture_output=True)
        print(out.stdout.strip() or f"command killed (rc {out.returncode})", flush=True)
""")


def test_a_second_sigint_to_the_process_group_spares_the_cleanups_commands():
    """A terminal sends Ctrl-C to the whole process group, the cleanup's scancel included:
    after the first one, the commands the run starts inherit SIGINT blocked and finish."""
    import os

    proc = subprocess.Popen([sys.executable, "-c", SHIELDED], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.stdout.readline().strip() == "stopping"
    time.sleep(0.4)
    os.killpg(proc.pid, signal.SIGINT)  # the second press, while the command runs
    out, err = proc.communicate(timeout=20)
    assert "scancel done" in out, (out, err)
    assert "cudalab: stopping" in err, "the repeat still reaches the handler"


def test_a_first_sigint_inside_an_event_loop_waits_until_the_loop_is_done():
    clock, later = Clock(), []
    busy = [True]
    h = OnceInterrupt(clock=clock, shield=lambda: None, busy=lambda: busy[0],
                      later=lambda: later.append(clock.t))
    h(signal.SIGINT, None)  # put off: no KeyboardInterrupt inside the loop
    assert later == [100.0] and h.first is None
    busy[0] = False
    clock.t += 0.1
    with pytest.raises(KeyboardInterrupt):
        h(signal.SIGINT, None)  # the retry, once the loop is over
    clock.t, busy[0] = 200.0, True
    h2 = OnceInterrupt(clock=clock, shield=lambda: None, busy=lambda: True,
                       later=lambda: None)
    h2(signal.SIGINT, None)
    clock.t += 6  # a loop that never ends does not swallow the Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        h2(signal.SIGINT, None)


def test_a_sigint_put_off_already_counts_as_stopping(monkeypatch):
    """stopping() is true from the first SIGINT on, also while it waits for Snakemake's
    event loop (interrupted() only once it is raised): a local job that dies of the same
    signal meanwhile is not reported as failed (cudalab/failures.py)."""
    from cudalab import interrupts

    clock = Clock()
    h = OnceInterrupt(clock=clock, shield=lambda: None, busy=lambda: True, later=lambda: None)
    monkeypatch.setattr(interrupts, "_INSTALLED", [h])
    assert not interrupts.stopping() and not interrupts.interrupted()
    h(signal.SIGINT, None)  # put off
    assert interrupts.stopping() and not interrupts.interrupted()


LOOP_CHILD = textwrap.dedent("""
    import asyncio, sys, time
    from cudalab import interrupts
    interrupts.install(grace_s=10)

    async def outputs_check():  # as Snakemake checks a finished job's outputs
        print("in loop", flush=True)
        time.sleep(1.0)
        await asyncio.sleep(0.2)

    runner = asyncio.Runner()
    try:
        runner.run(outputs_check())
        print("loop done", flush=True)
        time.sleep(5)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    runner.close()  # raises "Cannot close a running event loop" if the loop was broken
    print("closed", flush=True)
""")


def test_a_real_sigint_during_an_event_loop_run_leaves_the_loop_whole():
    proc = subprocess.Popen([sys.executable, "-c", LOOP_CHILD], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "in loop"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert out.split() == ["loop", "done", "interrupted", "closed"], (out, err)

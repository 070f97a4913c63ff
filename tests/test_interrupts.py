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
    clock, said = Clock(), []
    h = OnceInterrupt(grace_s=20, emit=said.append, clock=clock)
    with pytest.raises(KeyboardInterrupt):
        h(signal.SIGINT, None)
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

"""The Slurm executor's wakeable sleep (cudalab/status_wake.py) and the watcher's wake-up.

The executor here is the plugin's own class's interface (wait, lock, active_jobs, its
next sleep), held by a small object: the real one needs a Snakemake workflow. The real
cluster's tests (tests/slurm/test_slurm_fail_fast.py) run the plugin itself."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from types import SimpleNamespace

import pytest

from cudalab import pending, status_wake


def executor(sleep_s: float = 30.0, active: tuple[str, ...] = ()) -> SimpleNamespace:
    async def own_sleep() -> None:  # the plugin's: a plain asyncio.sleep
        await asyncio.sleep(sleep_s)

    return SimpleNamespace(wait=True, lock=threading.Lock(), sleep=own_sleep,
                           active_jobs=[SimpleNamespace(external_jobid=j) for j in active],
                           next_seconds_between_status_checks=sleep_s)


def timed_sleep(waker: status_wake.Waker, during=None) -> float:
    """Seconds one wait of the executor takes; `during` runs 0.2 s into it (another thread)."""
    if during is not None:
        threading.Timer(0.2, during).start()
    t0 = time.monotonic()
    asyncio.run(waker.executor.sleep())
    return time.monotonic() - t0


def test_the_plugin_still_waits_through_an_instance_sleep():
    """The hook depends on the executor's loop calling `self.sleep()` between checks and on
    the attributes install() reads: a new plugin version that drops them fails here."""
    from snakemake_executor_plugin_slurm import Executor
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    assert issubclass(Executor, RemoteExecutor)
    assert "await self.sleep()" in inspect.getsource(RemoteExecutor._wait_for_jobs)
    assert inspect.iscoroutinefunction(Executor.sleep)
    assert isinstance(Executor.next_seconds_between_status_checks, property)
    assert "self.wait = False" in inspect.getsource(RemoteExecutor.shutdown)


def test_install_replaces_sleep_and_refuses_other_executors():
    ex = executor()
    waker = status_wake.install(ex)
    assert waker is not None and ex.sleep == waker.sleep
    assert status_wake.install(SimpleNamespace(sleep=lambda: None)) is None
    assert status_wake.executor_of(SimpleNamespace()) is None


def test_the_wait_is_the_plugins_own_when_nothing_happens():
    waker = status_wake.install(executor(sleep_s=0.6))
    assert 0.55 < timed_sleep(waker) < 1.5


@pytest.mark.parametrize("how", ["wake", "shutdown"])
def test_a_wake_or_a_shutdown_cuts_a_long_wait_short(how):
    ex = executor(sleep_s=30)
    waker = status_wake.install(ex)
    act = waker.wake if how == "wake" else (lambda: setattr(ex, "wait", False))
    assert timed_sleep(waker, during=act) < 0.2 + status_wake.SLICE_S + 0.5
    if how == "wake":  # once: the next wait is the plugin's again
        ex.next_seconds_between_status_checks = 0.3
        assert timed_sleep(waker) > 0.25


def test_a_failure_stops_the_run_once_at_the_next_wait_while_jobs_run():
    stops: list[int] = []
    ex = executor(sleep_s=0.1, active=("41",))

    def stop() -> None:  # as Ctrl-C: Snakemake cancels the jobs and shuts the executor down
        stops.append(1)
        threading.Timer(0.1, lambda: setattr(ex, "wait", False)).start()

    waker = status_wake.install(ex, stop_run=stop)
    asyncio.run(ex.sleep())
    assert stops == []
    waker.stop_after("measure (results_matmul)")
    asyncio.run(ex.sleep())
    asyncio.run(ex.sleep())
    assert stops == [1] and waker.failed == ["measure (results_matmul)"] and waker.stopping


def test_a_failure_with_nothing_left_running_leaves_the_end_to_snakemake():
    stops: list[int] = []
    ex = executor(sleep_s=0.1)  # no active job: Snakemake ends the run itself
    waker = status_wake.install(ex, stop_run=lambda: stops.append(1))
    waker.stop_after("measure (results_matmul)")
    asyncio.run(ex.sleep())
    assert stops == [] and not waker.stopping


def test_the_watcher_wakes_the_plugin_when_a_job_left_the_queue(tmp_path):
    wd = str(tmp_path)
    ex = executor(active=("51", "52"))
    waker = status_wake.install(ex)
    queue = f"51|RUNNING|None|rule_measure_wildcards_results_a|{wd}\n"
    watch = pending.PendingWatch(wd, read=lambda argv: queue, waker=waker)
    watch.poll()
    assert waker.woken.is_set()  # 52 ended
    waker.woken.clear()
    queue += f"52|COMPLETING|None|rule_measure_wildcards_results_b|{wd}\n"
    watch.poll()
    assert not waker.woken.is_set()  # both still in the queue
    assert pending.ended_jobs("", {"7"}) == {"7"}


def test_after_the_stop_the_plugin_checks_no_more_until_shutdown():
    """A check after the stop would report the jobs the stop cancels as failed."""
    ex = executor(sleep_s=0.1, active=("61",))
    waker = status_wake.install(ex, stop_run=lambda: None)
    waker.stop_after("measure (results_vector_add)")
    assert timed_sleep(waker, during=lambda: setattr(ex, "wait", False)) > 0.15


def test_the_stop_wakes_the_main_thread_asleep_on_a_semaphore():
    """Snakemake's scheduler sleeps on a semaphore in the main thread: the stop, sent from
    the plugin's thread, must interrupt that sleep, not wait for the next release."""
    import signal

    sem = threading.Semaphore(0)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.2, status_wake.interrupt_run).start()
    release = threading.Timer(5.0, sem.release)  # the plugin's next check, as it were
    release.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            sem.acquire()
    finally:
        release.cancel()
        signal.signal(signal.SIGINT, old)
    assert time.monotonic() - t0 < 2.0


def test_a_stop_the_run_has_not_taken_is_sent_again(monkeypatch):
    monkeypatch.setattr(status_wake, "STOP_RETRY_S", 0.2)
    monkeypatch.setattr(status_wake, "SLICE_S", 0.05)
    sent: list[float] = []
    taken = threading.Event()
    ex = executor(sleep_s=0.1, active=("71",))
    waker = status_wake.install(ex, stop_run=lambda: sent.append(time.monotonic()),
                                stop_taken=taken.is_set)
    waker.stop_after("measure (results_vector_add)")
    t0 = time.monotonic()

    def shut_down() -> None:
        ex.wait = False

    threading.Timer(0.7, taken.set).start()
    threading.Timer(1.4, shut_down).start()
    asyncio.run(ex.sleep())
    # sent at once, then every 0.2 s until the run took it, and never after
    assert len(sent) >= 2 and all(t - t0 < 0.8 for t in sent), [t - t0 for t in sent]
    assert all(b - a >= 0.2 for a, b in zip(sent, sent[1:])), sent

"""Telemetry on a machine without a GPU: nvidia-smi output parsing (a recorded H100 sample),
throttle decoding and flagging, the harness with fake NVML readings, the nvidia-smi sampler's
life cycle against a stand-in nvidia-smi (start, stop, crash, SIGTERM), the paths where
nvidia-smi or NVML are missing, and the report's telemetry section."""

from __future__ import annotations

import itertools
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from cudalab import config as cfg
from cudalab import report, results, run_figures, telemetry, telemetry_report
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Experiment, Point, Result
from cudalab.experiments.lesson import Lesson
from cudalab.harness import Harness, Settings, WallTimer
from cudalab.nvml_clocks import NvmlClockObserver, decode_reasons, is_throttled
from cudalab.telemetry import (
    NvidiaSmiSampler,
    choose_fields,
    infer_utc_offset,
    parse_help_query_gpu,
    parse_nvidia_smi_csv,
    smi_device_id,
    throttling_samples,
)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "nvidia_smi_sample.csv"
# 2026/11/22 04:20:21.512 UTC, the first row of the sample
T0_UTC = 1795321221.512

# A stand-in nvidia-smi, written onto PATH by the fake_smi fixture.
FAKE_SMI = r'''# A stand-in for nvidia-smi in CPU tests.
#
# Understands what NvidiaSmiSampler runs: --help-query-gpu, -q -x, and --query-gpu=...
# --format=csv,nounits [--loop-ms=N] --id=X. Rows are printed in the local time of this process
# (as nvidia-smi does). Environment knobs: FAKE_SMI_PIDFILE (write the pid of the loop),
# FAKE_SMI_FAIL (exit 6 at once, like a node without a GPU), FAKE_SMI_OLD (a pre-530 driver: no
# clocks_event_reasons, no pcie.link.gen.gpucurrent, no power.draw.instant), FAKE_SMI_TZ
# (ignore TZ and print in this zone instead).

import os
import signal
import sys
import time

NEW = ["timestamp", "index", "uuid", "pstate", "clocks.sm", "clocks.current.sm", "clocks.mem",
       "clocks.current.memory", "clocks.max.sm", "power.draw", "power.draw.instant",
       "enforced.power.limit", "temperature.gpu", "temperature.memory", "utilization.gpu",
       "utilization.memory", "memory.used", "clocks_event_reasons.active",
       "clocks_throttle_reasons.active", "pcie.link.gen.gpucurrent", "pcie.link.gen.current",
       "pcie.link.width.current"]
OLD_MISSING = {"clocks_event_reasons.active", "pcie.link.gen.gpucurrent", "power.draw.instant"}
HEADER = {"clocks.sm": "clocks.current.sm [MHz]", "clocks.current.sm": "clocks.current.sm [MHz]",
          "clocks.mem": "clocks.current.memory [MHz]", "clocks.max.sm": "clocks.max.sm [MHz]",
          "power.draw": "power.draw [W]", "power.draw.instant": "power.draw.instant [W]",
          "enforced.power.limit": "enforced.power.limit [W]",
          "utilization.gpu": "utilization.gpu [%]", "utilization.memory": "utilization.memory [%]",
          "memory.used": "memory.used [MiB]"}
VALUE = {"index": "0", "uuid": "GPU-00000000-1111-2222-3333-444444444444", "pstate": "P0",
         "clocks.sm": "1980", "clocks.current.sm": "1980", "clocks.mem": "2619",
         "clocks.max.sm": "1980", "power.draw": "312.45", "power.draw.instant": "[N/A]",
         "enforced.power.limit": "700.00", "temperature.gpu": "41", "temperature.memory": "44",
         "utilization.gpu": "100", "utilization.memory": "37", "memory.used": "1045",
         "clocks_event_reasons.active": "0x0000000000000004",
         "clocks_throttle_reasons.active": "0x0000000000000004",
         "pcie.link.gen.gpucurrent": "5", "pcie.link.gen.current": "5",
         "pcie.link.width.current": "16"}


def known():
    return [f for f in NEW if not (os.environ.get("FAKE_SMI_OLD") and f in OLD_MISSING)]


def stamp():
    t = time.time()
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def main(argv):
    if os.environ.get("FAKE_SMI_TZ"):
        os.environ["TZ"] = os.environ["FAKE_SMI_TZ"]
        time.tzset()
    if os.environ.get("FAKE_SMI_FAIL"):
        print("No devices were found", file=sys.stderr)
        return 6
    if "--help-query-gpu" in argv:
        print('List of valid properties to query for the switch "--query-gpu":\n')
        for f in known():
            print(f'"{f}"\nSome description of {f}.\n')
        return 0
    if "-q" in argv and "-x" in argv:
        print('<?xml version="1.0" ?>\n<nvidia_smi_log><timestamp>' + stamp()
              + "</timestamp><driver_version>580.159.04</driver_version></nvidia_smi_log>")
        return 0
    query = next(a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu="))
    fields = query.split(",")
    bad = [f for f in fields if f not in known()]
    if bad:
        print(f'Field "{bad[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    loop = [int(a.split("=", 1)[1]) for a in argv if a.startswith("--loop-ms=")]
    if os.environ.get("FAKE_SMI_PIDFILE") and loop:
        with open(os.environ["FAKE_SMI_PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
    stop = []
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    print(", ".join(HEADER.get(f, f).replace("clocks_throttle_reasons", "clocks_event_reasons")
                    if not os.environ.get("FAKE_SMI_OLD") else HEADER.get(f, f)
                    for f in fields), flush=True)
    while not stop:
        print(", ".join(stamp() if f == "timestamp" else VALUE[f] for f in fields), flush=True)
        if not loop:
            break
        time.sleep(loop[0] / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """A stand-in nvidia-smi (tests/test_telemetry.py:FAKE_SMI); returns its path."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    exe = bindir / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_SMI)
    exe.chmod(0o755)
    monkeypatch.setenv("FAKE_SMI_PIDFILE", str(tmp_path / "smi.pid"))
    return exe


@pytest.fixture
def restore_tz():
    yield
    time.tzset()  # after monkeypatch has put TZ back


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_dead(pid: int, timeout: float = 5.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


class FakeNvml:
    """pynvml stand-in: SM clock and reasons mask per read, from prepared lists."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    def __init__(self, readings, fail_init: str = ""):
        self.readings = itertools.cycle(readings)
        self.fail_init = fail_init
        self.current = (1980, 0)
        self.shutdown = False

    def nvmlInit(self):
        if self.fail_init:
            raise OSError(self.fail_init)

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, i):
        return "handle"

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetClockInfo(self, h, kind):
        self.current = next(self.readings)
        return self.current[0]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.current[1]

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlDeviceGetUUID(self, h):
        return "GPU-00000000-1111-2222-3333-444444444444"


class FakeTimer:
    name = "fake"

    def __init__(self, durations=(1e-3, 2e-3), log=None):
        self.durations = itertools.cycle(durations)
        self.log = log if log is not None else []

    def time(self, fn, reps):
        self.log.append("start")
        for _ in range(reps):
            fn()
        self.log.append("end")
        return sum(next(self.durations) for _ in range(reps))


# -- parsing a recorded nvidia-smi 580 sample --------------------------------------------------
def test_recorded_sample_parses_into_logical_typed_columns():
    df = parse_nvidia_smi_csv(SAMPLE.read_text(), utc_offset_s=0)
    assert len(df) == 25
    # canonical headers (clocks.current.sm [MHz], pcie.link.gen.gpucurrent) -> logical names
    for col in telemetry.QUERY_FIELDS:
        assert col in df.columns, col
    assert df["clocks.sm"].iloc[0] == 345 and df["clocks.sm"].max() == 1980
    assert df["clocks.mem"].eq(2619).all() and df["clocks.max.sm"].eq(1980).all()
    assert df["pcie.link.gen.current"].iloc[0] == 1 and df["pcie.link.gen.current"].max() == 5
    assert df["uuid"].iloc[0].startswith("GPU-") and df["pstate"].iloc[0] == "P0"
    # "[N/A]" -> NaN, numbers stay numbers
    assert df["power.draw.instant"].isna().sum() == 1
    assert df["power.draw"].notna().all() and df["power.draw"].max() == pytest.approx(698.02)
    # the reasons bitmask 0x0000000000000004 -> 4
    masks = df["clocks_event_reasons.active"]
    assert set(masks.astype(int)) == {0, 1, 4}
    assert (masks == 4).sum() == 5
    # timestamps -> unix seconds on the runner's clock
    assert df["t"].iloc[0] == pytest.approx(T0_UTC, abs=1e-3)
    assert df["t"].diff().dropna().between(0.09, 0.11).all()


def test_timestamps_use_the_given_offset_or_the_local_time_zone(monkeypatch, restore_tz):
    text = SAMPLE.read_text()
    # printed in UTC+2 -> two hours earlier in unix time
    t_east = parse_nvidia_smi_csv(text, utc_offset_s=7200)["t"].iloc[0]
    assert t_east == pytest.approx(T0_UTC - 7200, abs=1e-3)
    # no offset given: read as local time of this process (POSIX TZ: XXX-2 is UTC+2)
    monkeypatch.setenv("TZ", "XXX-2")
    time.tzset()
    assert parse_nvidia_smi_csv(text)["t"].iloc[0] == pytest.approx(T0_UTC - 7200, abs=1e-3)
    monkeypatch.setenv("TZ", "UTC0")
    time.tzset()
    assert parse_nvidia_smi_csv(text)["t"].iloc[0] == pytest.approx(T0_UTC, abs=1e-3)


def test_old_driver_headers_units_repeats_and_torn_lines():
    # format=csv (units in the values), a pre-530 header, as printed twice (two loops)
    header = ("timestamp, clocks.current.sm [MHz], power.draw [W], "
              "clocks_throttle_reasons.active, pcie.link.gen.current\n")
    text = (header + "2026/11/22 04:20:21.512, 1410 MHz, 250.10 W, 0x0000000000000040, 4\n"
            + header + "2026/11/22 04:20:22, [Not Supported], N/A, [N/A], 4\n"
            + "2026/11/22 04:20:22.600, 1410\n")
    df = parse_nvidia_smi_csv(text, utc_offset_s=0)
    assert len(df) == 2  # repeated header and torn last line dropped
    assert df["clocks.sm"].iloc[0] == 1410 and math.isnan(df["clocks.sm"].iloc[1])
    assert df["power.draw"].iloc[0] == pytest.approx(250.1) and math.isnan(df["power.draw"].iloc[1])
    assert df["clocks_event_reasons.active"].iloc[0] == 0x40
    assert math.isnan(df["clocks_event_reasons.active"].iloc[1])
    assert df["t"].iloc[1] == pytest.approx(T0_UTC + 0.488, abs=1e-3)  # no milliseconds
    assert parse_nvidia_smi_csv("").empty


def test_field_choice_follows_the_drivers_help_list():
    help_580 = ('List of valid properties to query for the switch "--query-gpu":\n\n'
                + "".join(f'"{a}" or "{b}"\nabout it.\n\n' if b else f'"{a}"\nabout it.\n\n'
                          for a, b in [("timestamp", ""), ("index", ""), ("uuid", "gpu_uuid"),
                                       ("pstate", ""), ("clocks.current.sm", "clocks.sm"),
                                       ("clocks.current.memory", "clocks.mem"),
                                       ("clocks.max.sm", "clocks.max.sm"), ("power.draw", ""),
                                       ("power.draw.instant", ""),
                                       ("enforced.power.limit", ""), ("temperature.gpu", ""),
                                       ("temperature.memory", ""), ("utilization.gpu", ""),
                                       ("utilization.memory", ""), ("memory.used", ""),
                                       ("clocks_event_reasons.active",
                                        "clocks_throttle_reasons.active"),
                                       ("pcie.link.gen.current", ""),
                                       ("pcie.link.gen.gpucurrent", ""),
                                       ("pcie.link.width.current", "")]))
    known = parse_help_query_gpu(help_580)
    assert "clocks_throttle_reasons.active" in known and "about" not in known
    fields = choose_fields(known)
    assert "clocks_event_reasons.active" in fields and "pcie.link.gen.gpucurrent" in fields
    assert "power.draw.instant" in fields and "clocks.sm" in fields
    # a pre-530 driver: old names, optional fields dropped
    old = known - {"clocks_event_reasons.active", "pcie.link.gen.gpucurrent",
                   "power.draw.instant", "temperature.memory"}
    fields = choose_fields(old)
    assert "clocks_throttle_reasons.active" in fields and "pcie.link.gen.current" in fields
    assert "power.draw.instant" not in fields and "temperature.memory" not in fields
    assert choose_fields(old - {"clocks.max.sm"}) == []  # a required field is missing


def test_pci_bus_id_in_nvidia_smi_spelling_and_utc_offset():
    assert smi_device_id("0000:18:00.0") == "00000000:18:00.0"
    assert smi_device_id("00000000:af:00.0") == "00000000:AF:00.0"
    assert smi_device_id("", 3) == "3" and smi_device_id("garbage", 1) == "1"
    launch = 1_800_000_000.0
    assert infer_utc_offset(launch + 0.4, launch) == 0
    assert infer_utc_offset(launch + 7200 + 1.7, launch) == 7200
    assert infer_utc_offset(launch - 5 * 3600 - 30 * 60 + 0.2, launch) == -19800
    assert infer_utc_offset(launch + 5.75 * 3600 + 2, launch) == 20700  # Nepal


# -- throttle decoding and flagging --------------------------------------------------------
def test_reason_decoding_and_the_throttle_rule():
    assert decode_reasons(0) == []
    assert decode_reasons(0x4) == ["sw_power_cap"]
    assert decode_reasons(0x41) == ["gpu_idle", "hw_thermal_slowdown"]
    assert decode_reasons(0x1000) == ["bit_0x1000"]
    # idle, application clocks and display clock are not throttling
    for mask in (0x0, 0x1, 0x2, 0x100, 0x103):
        assert not is_throttled(1980, 1980, mask, 0.85), hex(mask)
    for mask in (0x4, 0x8, 0x10, 0x20, 0x40, 0x80, 0x1000):
        assert is_throttled(1980, 1980, mask, 0.85), hex(mask)
    assert is_throttled(1600, 1980, 0, 0.85) and not is_throttled(1700, 1980, 0, 0.85)
    assert not is_throttled(1600, 0, 0, 0.85)  # max clock unknown: no clock rule


def test_throttling_samples_of_the_recorded_sample():
    df = parse_nvidia_smi_csv(SAMPLE.read_text(), utc_offset_s=0)
    hot = throttling_samples(df, 0.85)
    # the five sw_power_cap rows; the low clocks while idle (0x1) do not count
    assert hot.sum() == 5
    assert (df.loc[hot, "clocks_event_reasons.active"] == 4).all()


def test_nvml_observer_flags_chunks_and_the_harness_flags_their_samples():
    readings = [(1980, 0)]  # read once at start-up
    readings += [(1980, 0), (1980, 0)]  # chunk 1 (10 samples): fine
    readings += [(1980, 0), (1600, 0)]  # chunk 2 (20): clock dropped below 0.85 x max
    readings += [(1980, 0x4), (1980, 0)]  # chunk 3 (40): power cap at the start
    readings += [(1980, 0x1), (1980, 0x1)]  # chunk 4 (80): idle reason: fine
    readings += [(1980, 0x100), (1980, 0x2)]  # chunk 5 (100): display/app clocks: fine
    nvml = FakeNvml(readings)
    obs = NvmlClockObserver(0, ratio=0.85, pci_bus_id="0000:18:00.0", nvml=nvml)
    assert obs.active and obs.status()["nvml"] == "ok" and obs.max_sm == 1980
    h = Harness(Settings(warmup=1, min_samples=10, max_samples=250, target_cv=1e-9,
                         budget_s=60, min_sample_s=0), observers=[obs])
    t = h.measure(lambda: None, FakeTimer())
    assert [c["n"] for c in t.chunks] == [10, 20, 40, 80, 100]
    assert [c["throttled"] for c in t.chunks] == [False, True, True, False, False]
    assert t.throttled == [False] * 10 + [True] * 60 + [False] * 180
    assert t.as_dict()["n_throttled"] == 60
    c2, c3 = t.chunks[1], t.chunks[2]
    assert (c2["sm_clock_mhz_before"], c2["sm_clock_mhz_after"]) == (1980, 1600)
    assert c3["clock_reasons"] == ["sw_power_cap"] and c3["clock_reasons_mask"] == 4
    assert all(c["t"] <= c["t_end"] for c in t.chunks)  # unix time, the runner's clock
    assert abs(t.chunks[0]["t"] - time.time()) < 60
    assert obs.status()["nvml_chunks_flagged"] == 2
    obs.after_job()
    assert nvml.shutdown


def test_nvml_missing_or_failing_leaves_measuring_alone():
    obs = NvmlClockObserver(0, nvml=FakeNvml([(1980, 0)], fail_init="NVML Shared Library "
                                                                      "Not Found"))
    st = obs.status()
    assert st["nvml"] == "unavailable" and "NVML Shared Library Not Found" in st["nvml_reason"]
    assert not obs.active and obs.device_facts() == {}
    obs.before_batch()
    assert obs.after_batch() == {}
    t = Harness(Settings(warmup=0, min_samples=3, max_samples=3, min_sample_s=0),
                observers=[obs]).measure(lambda: None, FakeTimer((1e-3,)))
    assert t.n == 3 and t.throttled == [False] * 3
    # the real library on this machine: whatever happens, it never raises
    real = NvmlClockObserver(0)
    assert real.status()["nvml"] in ("ok", "unavailable")
    if not shutil.which("nvidia-smi"):
        assert real.status()["nvml"] == "unavailable" and real.status()["nvml_reason"]

    class Broken(FakeNvml):  # the GPU disappears mid-job
        def nvmlDeviceGetClockInfo(self, h, kind):
            raise RuntimeError("GPU is lost")

    obs = NvmlClockObserver(0, nvml=FakeNvml([(1980, 0)]))
    obs.nvml = Broken([(0, 0)])
    obs.before_batch()
    assert obs.after_batch() == {} and not obs.active
    assert "GPU is lost" in obs.status()["nvml_reason"]


# -- cold runs (L2 flush) ------------------------------------------------------------------
def test_cold_runs_flush_outside_the_timed_region_before_every_sample():
    log = []
    h = Harness(Settings(warmup=2, min_samples=5, max_samples=7, target_cv=1e-9, budget_s=60,
                         min_sample_s=1e-3, cold_l2=True),
                flush_l2=lambda: log.append("flush"))
    t = h.measure(lambda: log.append("fn"), FakeTimer((1e-6, 2e-6), log))
    assert t.batch == 1  # cold samples are never batched (a batch would warm the cache)
    assert log[:2] == ["fn", "fn"]  # warm-up is not flushed
    timed = log[2:]
    assert timed == ["flush", "start", "fn", "end"] * t.n
    assert t.n == 7
    # asked for cold runs but no flusher (CPU-only job): warm, batched as usual
    t = Harness(Settings(warmup=0, min_samples=3, max_samples=3, min_sample_s=1e-3,
                         cold_l2=True)).measure(lambda: None, FakeTimer((1e-6,)))
    assert t.batch > 1
    # the config block maps onto the harness settings
    c = cfg.validate({"measurement": {"cold_l2": True, "target_cv": 0.05, "budget_s": 2,
                                       "min_samples": 7},
                      "experiments": {"matmul": {"variants": ["cpu"]}}})
    s = Settings.from_config(c["measurement"])
    assert (s.cold_l2, s.target_cv, s.budget_s, s.min_samples) == (True, 0.05, 2, 7)


# -- the nvidia-smi sampler ------------------------------------------------------------------
def test_sampler_without_nvidia_smi_says_why(tmp_path):
    s = NvidiaSmiSampler(tmp_path / "tel", "00000000:18:00.0", 100, exe="")
    s.before_job()
    s.after_job()
    st = s.status()
    assert st["nvidia_smi"] == "unavailable"
    assert st["nvidia_smi_reason"] == "nvidia-smi not found on PATH"
    assert (tmp_path / "tel").is_dir() and not (tmp_path / "tel" / "nvidia_smi.csv").exists()


def test_sampler_records_the_whole_job_and_stops(fake_smi, tmp_path):
    out = tmp_path / "tel"
    s = NvidiaSmiSampler(out, "00000000:18:00.0", 50, exe=str(fake_smi))
    t_before = time.time()
    old_term = signal.getsignal(signal.SIGTERM)
    s.before_job()
    pid = int((tmp_path / "smi.pid").read_text())
    assert _alive(pid)
    assert signal.getsignal(signal.SIGTERM) != old_term  # our handler while it runs
    time.sleep(0.4)
    s.after_job()
    t_after = time.time()
    assert _wait_dead(pid)
    assert signal.getsignal(signal.SIGTERM) == old_term  # put back
    st = s.status()
    assert st["nvidia_smi"] == "ok", st
    assert st["nvidia_smi_samples"] >= 4 and st["nvidia_smi_utc_offset_s"] == 0
    assert "clocks_event_reasons.active" in st["nvidia_smi_fields"]
    assert st["nvidia_smi_id"] == "00000000:18:00.0"
    for f in ("nvidia_smi.csv", "nvidia_smi_before.xml", "nvidia_smi_after.xml",
              "nvidia_smi_fields.txt"):
        assert (out / f).stat().st_size > 0, f
    df = parse_nvidia_smi_csv((out / "nvidia_smi.csv").read_text(),
                              st["nvidia_smi_utc_offset_s"])
    assert df["t"].between(t_before - 1, t_after + 1).all()
    assert df["clocks_event_reasons.active"].eq(4).all()
    s.after_job()  # a second stop is harmless


def test_sampler_measures_the_offset_when_nvidia_smi_ignores_tz(fake_smi, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv("FAKE_SMI_TZ", "XXX-2")  # prints UTC+2 whatever TZ says
    s = NvidiaSmiSampler(tmp_path / "tel", "0", 50, exe=str(fake_smi))
    t_before = time.time()
    s.before_job()
    time.sleep(0.2)
    s.after_job()
    st = s.status()
    assert st["nvidia_smi_utc_offset_s"] == 7200
    df = parse_nvidia_smi_csv((tmp_path / "tel" / "nvidia_smi.csv").read_text(), 7200)
    assert df["t"].between(t_before - 1, time.time() + 1).all()


def test_sampler_falls_back_to_old_field_names(fake_smi, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_OLD", "1")
    s = NvidiaSmiSampler(tmp_path / "tel", "0", 50, exe=str(fake_smi))
    s.before_job()
    time.sleep(0.15)
    s.after_job()
    st = s.status()
    assert st["nvidia_smi"] == "ok", st
    assert "clocks_throttle_reasons.active" in st["nvidia_smi_fields"]
    assert "power.draw.instant" not in st["nvidia_smi_fields"]
    df = parse_nvidia_smi_csv((tmp_path / "tel" / "nvidia_smi.csv").read_text(), 0)
    assert df["clocks_event_reasons.active"].eq(4).all()  # same logical column


def test_sampler_that_fails_at_once_says_why(fake_smi, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_FAIL", "1")
    s = NvidiaSmiSampler(tmp_path / "tel", "0", 50, exe=str(fake_smi))
    s.before_job()
    s.after_job()
    st = s.status()
    assert st["nvidia_smi"] == "unavailable"
    assert "No devices were found" in st["nvidia_smi_reason"]


CHILD = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from cudalab.telemetry import NvidiaSmiSampler
s = NvidiaSmiSampler(Path({out!r}), "0", 50, exe={exe!r})
s.before_job()
mode = sys.argv[1]
if mode == "kill":
    print("started", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "exit":
    print("started", flush=True)
    sys.exit(3)  # no after_job: the atexit hook must stop nvidia-smi
try:
    print("started", flush=True)  # inside try: a SIGTERM from now on runs the finally
    time.sleep(60)
finally:
    s.after_job()
"""


def _pid_written(path: Path, timeout_s: float = 20.0) -> int:
    """The fake nvidia-smi writes its pid once it runs, which on a loaded machine can be
    after the sampler's before_job() has returned (Popen does not wait for the exec)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        text = path.read_text() if path.exists() else ""
        if text.strip():
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"the fake nvidia-smi never wrote {path}")


@pytest.mark.parametrize("mode", ["kill", "term", "exit"])
def test_no_nvidia_smi_outlives_its_job(mode, fake_smi, tmp_path):
    if mode == "kill" and not telemetry._pdeathsig_prefix():
        pytest.skip("setpriv --pdeathsig is not available here")
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=str(ROOT), out=str(tmp_path / "tel"),
                                   exe=str(fake_smi)))
    child = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE,
                             text=True, env=os.environ.copy())
    assert child.stdout.readline().strip() == "started"
    pid = _pid_written(tmp_path / "smi.pid")
    if mode == "term":
        assert _alive(pid)
        child.send_signal(signal.SIGTERM)
    rc = child.wait(timeout=20)
    assert rc == {"kill": -signal.SIGKILL, "term": 128 + signal.SIGTERM, "exit": 3}[mode]
    assert _wait_dead(pid), f"nvidia-smi (pid {pid}) still running after a {mode}"
    if mode == "term":  # finally ran: the after snapshot was taken
        assert (tmp_path / "tel" / "nvidia_smi_after.xml").exists()


# -- a GPU job's telemetry through the real runner (fake GPU session) -------------------------
class FakeGpuExperiment(Experiment):
    name = "fakegpu"
    lesson = Lesson(title="A fake GPU experiment", caption="")
    no_check_reason = "a test double: it computes nothing to check"

    def points(self, block):
        return [Point(self.name, "spin", {"n": n}) for n in block["sizes"]] + [
            Point(self.name, "cpu", {"n": block["sizes"][0]}, gpu=False)]

    def measure(self, ctx, point):
        n = point.params["n"]
        t = ctx.harness.measure(lambda: sum(range(n)), WallTimer())
        # a real point lasts longer than the sampler's start-up (a Python process here) plus
        # a few 50 ms intervals; without this the job can end after a single sample
        time.sleep(0.25)
        return Result(t, flops=float(n))


class FakeSession:
    index = 0
    info = {"gpu_name": "Fake H100", "gpu_uuid": "GPU-from-pycuda",
            "gpu_pci_bus_id": "0000:18:00.0", "compute_capability": "9.0",
            "cuda_driver_api": "13.0", "cuda_version": "13.0.0", "pycuda_version": "2026.1",
            "nvcc_version": "13.0.88", "total_memory_bytes": 85017493504}

    def l2_flusher(self):
        return lambda: None


def _fake_gpu_job(tmp_path, monkeypatch, nvml, smi_exe):
    from cudalab import gpu as gpumod
    from cudalab.runner import run_experiment

    monkeypatch.setitem(REGISTRY, "fakegpu", FakeGpuExperiment())
    monkeypatch.setattr(gpumod, "open_session", lambda index=0: FakeSession())
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    real_which = shutil.which
    monkeypatch.setattr(telemetry.shutil, "which",
                        lambda name, *a, **k: smi_exe if name == "nvidia-smi"
                        else real_which(name, *a, **k))
    config = {"run_name": "t", "seed": 1, "gpu_index": 0,
              "measurement": {"warmup": 1, "min_samples": 10, "max_samples": 30,
                              "target_cv": 0, "budget_s": 0.05, "min_sample_s": 0},
              "telemetry": {"nvidia_smi": True, "interval_ms": 50, "nvml": True,
                            "throttle_clock_ratio": 0.85},
              "experiments": {"fakegpu": {"sizes": [1000, 20000]}},
              "report": {"title": "t", "max_table_rows": 50}}
    manifest = run_experiment(config, "fakegpu", tmp_path / "results")
    recs = list(results.iter_records(tmp_path / "results" / "raw"))
    return config, manifest, recs


@pytest.mark.slow
def test_gpu_job_without_nvidia_smi_or_nvml_measures_and_says_why(tmp_path, monkeypatch):
    nvml = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(
        OSError("NVML Shared Library Not Found")))
    config, m, recs = _fake_gpu_job(tmp_path, monkeypatch, nvml, None)
    assert m["counts"]["ok"] == 3 and len(recs) == 3
    tel = m["telemetry"]
    assert tel["nvidia_smi"] == "unavailable"
    assert tel["nvidia_smi_reason"] == "nvidia-smi not found on PATH"
    assert tel["nvml"] == "unavailable" and "NVML Shared Library Not Found" in tel["nvml_reason"]
    # throttling unknown, not 0, and each record says why
    for r in recs:
        assert r["timing"]["n_throttled"] is None
        assert r["timing"]["throttle_check"].startswith(("not checked", "not applicable"))
    gpu_rec = next(r for r in recs if r["variant"] == "spin")
    assert "NVML Shared Library Not Found" in gpu_rec["timing"]["throttle_check"]
    # the driver version falls back to /proc (absent here) -> 'unknown', never the CUDA API
    assert gpu_rec["provenance"]["driver_version"] not in ("", "13.0")
    df = results.build_table(recs)
    assert results.check_table(df) == [] and df["n_throttled"].isna().all()
    # the figures step says it, and the report shows it
    run_figures.draw(df, tmp_path / "results", tmp_path / "figs")
    secs = run_figures.read(tmp_path / "figs")["telemetry"]
    assert len(secs) == 1 and secs[0]["src"] == ""
    assert "nvidia-smi not found on PATH" in secs[0]["status"]
    assert "NVML Shared Library Not Found" in secs[0]["status"]
    html = report.render(df, tmp_path / "figs", config, tmp_path / "r.html").read_text()
    assert "nvidia-smi not found on PATH" in html and "NVML unavailable" in html


def test_gpu_job_with_telemetry_aligns_samples_and_points(fake_smi, tmp_path, monkeypatch):
    # a throttle reason on every other reading: the trials and the resolution floor read
    # NVML too, so a sparser pattern may miss every sample
    nvml = FakeNvml([(1980, 0), (1980, 0x4)])
    config, m, recs = _fake_gpu_job(tmp_path, monkeypatch, nvml, str(fake_smi))
    tel = m["telemetry"]
    assert tel["nvidia_smi"] == "ok" and tel["nvml"] == "ok", tel
    assert tel["nvidia_smi_id"] == "00000000:18:00.0"  # nvidia-smi's spelling of the bus id
    gpu_recs = [r for r in recs if r["variant"] == "spin"]
    assert all(r["provenance"]["driver_version"] == "580.159.04" for r in gpu_recs)
    assert all(r["provenance"]["gpu_uuid"] == nvml.nvmlDeviceGetUUID(0) for r in gpu_recs)
    assert all(r["timing"]["n_throttled"] is not None for r in gpu_recs)
    assert all("sm_clock_mhz_before" in c for r in gpu_recs for c in r["timing"]["chunks"])
    assert any(r["timing"]["n_throttled"] > 0 for r in gpu_recs)
    # phases carry their throttle counts; the CPU point's is unknown
    assert {p["point_id"] for p in m["phases"]} == {r["point_id"] for r in recs}
    tdir = tmp_path / "results" / "telemetry" / m["job_id"]
    df = telemetry_report.load_samples(tdir / "nvidia_smi.csv", m)
    assert len(df) >= 2
    assert df["t"].min() >= m["t_start"] - 2 and df["t"].max() <= m["t_end"] + 2
    # the figures step: a figure, phases marked, a caption with the counts; the report
    # embeds it
    figs = tmp_path / "figs"
    run_figures.draw(results.build_table(recs), tmp_path / "results", figs)
    secs = run_figures.read(figs)["telemetry"]
    assert secs[0]["src"].startswith("data:image/png;base64,")
    assert secs[0]["status"] == "" and "points were measured" in secs[0]["caption"]
    assert (figs / "_telemetry" / f"{m['job_id']}.png").exists()


# -- the report's telemetry section from a fabricated manifest --------------------------------
def _manifest(job_id, tdir, tel, phases=()):
    return {"experiment": "matmul", "job_id": job_id, "t_start": T0_UTC + 0.15,
            "t_end": T0_UTC + 2.3, "points": {}, "phases": list(phases), "telemetry": tel,
            "telemetry_dir": str(tdir), "provenance": {}, "seed": 1, "counts": {}}


def test_report_sections_from_fabricated_manifests(tmp_path):
    res = tmp_path / "results"
    # 1: recorded samples, copied results (the recorded absolute path does not exist here)
    (res / "telemetry" / "matmul-1").mkdir(parents=True)
    shutil.copy(SAMPLE, res / "telemetry" / "matmul-1" / "nvidia_smi.csv")
    phases = [{"point_id": "tiled-m4096-tile32", "t_start": T0_UTC + 0.3, "t_end": T0_UTC + 1.0,
               "n_throttled": 0},
              {"point_id": "tiled-m4096-tile16", "t_start": T0_UTC + 1.0,
               "t_end": T0_UTC + 1.9, "n_throttled": 20}]
    ok = {"nvidia_smi": "ok", "nvidia_smi_reason": "", "nvidia_smi_utc_offset_s": 0,
          "nvml": "ok", "nvml_reason": "", "nvml_throttle_ratio": 0.85}
    m1 = _manifest("matmul-1", "/elsewhere/results/telemetry/matmul-1", ok, phases)
    # 2: neither nvidia-smi nor NVML
    bad = {"nvidia_smi": "unavailable", "nvidia_smi_reason": "nvidia-smi not found on PATH",
           "nvml": "unavailable", "nvml_reason": "NVML unavailable: NVMLError_LibraryNotFound"}
    m2 = _manifest("vector_add-2", res / "telemetry" / "vector_add-2", bad)
    m2["experiment"] = "vector_add"
    # 3: CPU-only job: no section
    m3 = _manifest("cpu-3", "", {"nvidia_smi": "not applicable"})
    m3["experiment"] = "cpuonly"
    for m in (m1, m2, m3):
        results.write_json_atomic(res / "raw" / m["experiment"] / "_manifest.json", m)

    s = telemetry_report.summarize_job(
        telemetry_report.load_samples(res / "telemetry" / "matmul-1" / "nvidia_smi.csv", m1), m1)
    assert s["n_samples"] == 25 and s["n_in_points"] == 16
    assert s["n_throttling_in_points"] == 5 and s["n_points_throttled"] == 1
    assert s["sm_clock_min_mhz"] == 1755 and s["max_sm_clock_mhz"] == 1980
    assert s["power_max_w"] == pytest.approx(700.12) and s["temperature_max_c"] == 48

    secs = {e["job_id"]: e for e in telemetry_report.sections(res, tmp_path / "figs")}
    assert set(secs) == {"matmul-1", "vector_add-2"}
    assert secs["matmul-1"]["png"] == str(tmp_path / "figs" / "matmul-1.png")
    assert Path(secs["matmul-1"]["png"]).stat().st_size > 1000
    assert secs["matmul-1"]["status"] == ""
    assert "25 nvidia-smi samples" in secs["matmul-1"]["caption"]
    assert "5 samples during points with a throttle reason" in secs["matmul-1"]["caption"]
    assert secs["vector_add-2"]["png"] == ""
    assert "nvidia-smi not found on PATH" in secs["vector_add-2"]["status"]
    assert "NVMLError_LibraryNotFound" in secs["vector_add-2"]["status"]

    # a local-time sample read without a recorded offset still parses (host TZ)
    m1["telemetry"]["nvidia_smi_utc_offset_s"] = None
    assert telemetry_report.load_samples(
        res / "telemetry" / "matmul-1" / "nvidia_smi.csv", m1)["t"].notna().all()


def test_report_counts_throttled_samples_per_experiment(tmp_path):
    recs = list(results.iter_records(ROOT / "tests" / "data" / "recorded_h100" / "raw"))
    assert recs
    recs[0]["timing"]["n_throttled"] = 3
    recs[1]["timing"]["n_throttled"] = 2
    df = results.build_table(recs)
    config = cfg.validate({"experiments": {"matmul": {}}})
    ctx = report.build_context(df, tmp_path, config)
    sec = next(s for s in ctx["sections"] if s["name"] == "matmul")
    gpu = df["n_throttled"].notna()
    assert sec["throttle_note"].startswith(
        f"{int(df['n_samples'].sum())} timed samples; "
        f"{int(df.loc[gpu, 'n_samples'].sum())} checked for throttling (NVML), "
        "5 taken while throttled")
    html = report.render(df, tmp_path, config, tmp_path / "r.html").read_text()
    assert "5 taken while throttled" in html


def test_a_failing_telemetry_hook_never_stops_the_job(fake_smi, tmp_path, monkeypatch):
    def broken(self):
        raise PermissionError("telemetry folder not writable")

    monkeypatch.setattr(NvidiaSmiSampler, "before_job", broken)
    _, m, recs = _fake_gpu_job(tmp_path, monkeypatch, FakeNvml([(1980, 0)]), str(fake_smi))
    assert m["counts"]["ok"] == 3
    assert m["telemetry"]["nvidia_smi"] == "unavailable"
    assert "telemetry folder not writable" in m["telemetry"]["nvidia_smi_reason"]
    assert m["telemetry"]["nvml"] == "ok"


@pytest.mark.slow
def test_the_run_figures_drawn_in_processes_are_those_drawn_in_one(tmp_path):
    """The figures step draws a figure a task in several processes (--jobs): the same
    rooflines, telemetry figures and indexes as one process draws, in the same order."""
    from cudalab import roofline

    ref = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"
    df = roofline.load_table(ref / "results.csv")
    one = run_figures.draw(df, ref, tmp_path / "one")
    two = run_figures.draw(df, ref, tmp_path / "two", workers=2)
    assert one == two and one["roofline"] >= 2 and one["telemetry"] >= 10, (one, two)
    for d in (run_figures.ROOFLINE_DIR, run_figures.TELEMETRY_DIR):
        a, b = (sorted(p.name for p in (tmp_path / w / d).iterdir()) for w in ("one", "two"))
        assert a == b
        index_one = (tmp_path / "one" / d / run_figures.INDEX).read_text()
        assert index_one == (tmp_path / "two" / d / run_figures.INDEX).read_text()


def test_run_figures_refuses_fewer_than_one_process(capsys):
    from cudalab import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["run-figures", "--jobs", "0"])
    assert exit_.value.code == 2
    assert "--jobs: 0: give 1 or more" in capsys.readouterr().err

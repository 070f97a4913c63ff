"""Telemetry of a GPU job: each source is a small class with job- and batch-level hooks
(Kernel Tuner's observer idea).

- NvidiaSmiSampler: `nvidia-smi --query-gpu=... --format=csv,nounits --loop-ms=N --id=<bus id>`
  for the whole job, plus `nvidia-smi -q -x` snapshots before and after. Writes
  results/telemetry/<job_id>/{nvidia_smi.csv, nvidia_smi_before.xml, nvidia_smi_after.xml,
  nvidia_smi_fields.txt, nvidia_smi.stderr}.
- NvmlClockObserver (cudalab.nvml_clocks): SM clock and clock-event ("throttle") reasons
  (nvidia-ml-py) at the start and end of every timed chunk of the harness, so samples of a
  throttled chunk are flagged.

Nothing here changes clocks, power limits or any other GPU setting: it only reads.

One clock for everything: the runner stamps grid points with `time.time()` (unix seconds) and
the harness stamps chunks the same way. nvidia-smi's `timestamp` column is wall-clock text,
"YYYY/MM/DD HH:MM:SS.mmm", in the time zone of the nvidia-smi process, with no zone marker.
The sampler starts nvidia-smi with TZ=UTC0 and, after the job, measures the offset of the
printed times against `time.time()` at launch (rounded to 15 minutes, the granularity of real
time zones), so it holds whether or not nvidia-smi honours TZ and whatever the host's zone is.
The offset goes into the job manifest (telemetry.nvidia_smi_utc_offset_s) and
`parse_nvidia_smi_csv(text, utc_offset_s)` turns the column into unix seconds (`t`). Without a
known offset the text is read as local time of the machine that parses it (the host's TZ).

Without nvidia-smi or NVML a job still measures; `status()` says why telemetry is missing.
"""

from __future__ import annotations

import atexit
import csv
import datetime as dt
import io
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd

from cudalab.nvml_clocks import THROTTLING_MASK

# Logical columns of the nvidia-smi CSV, each with the query names that may provide it, best
# first. nvidia-smi >= 530 names the reasons field clocks_event_reasons (the old
# clocks_throttle_reasons name is kept as an alias); pcie.link.gen.current is deprecated in
# favour of pcie.link.gen.gpucurrent. Optional fields are dropped where the driver lacks them.
FIELD_CANDIDATES: dict[str, tuple[list[str], bool]] = {
    # logical name: ([query names], required)
    "timestamp": (["timestamp"], True),
    "index": (["index"], True),
    "uuid": (["uuid"], True),
    "pstate": (["pstate"], False),
    "clocks.sm": (["clocks.sm", "clocks.current.sm"], True),
    "clocks.mem": (["clocks.mem", "clocks.current.memory"], True),
    "clocks.max.sm": (["clocks.max.sm"], True),
    "power.draw": (["power.draw"], True),
    "power.draw.instant": (["power.draw.instant"], False),
    "enforced.power.limit": (["enforced.power.limit"], False),
    "temperature.gpu": (["temperature.gpu"], True),
    "temperature.memory": (["temperature.memory"], False),
    "utilization.gpu": (["utilization.gpu"], True),
    "utilization.memory": (["utilization.memory"], True),
    "memory.used": (["memory.used"], True),
    "clocks_event_reasons.active": (
        ["clocks_event_reasons.active", "clocks_throttle_reasons.active"], True),
    "pcie.link.gen.current": (["pcie.link.gen.gpucurrent", "pcie.link.gen.current"], True),
    "pcie.link.width.current": (["pcie.link.width.current"], True),
}
QUERY_FIELDS = list(FIELD_CANDIDATES)

# CSV header (unit stripped) -> logical name. nvidia-smi prints the canonical name of a field
# in the header, not the alias asked for (clocks.sm -> "clocks.current.sm [MHz]").
HEADER_ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks.max.memory": "clocks.max.mem",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "pcie.link.gen.gpucurrent": "pcie.link.gen.current",
    "gpu_uuid": "uuid",
    "gpu_name": "name",
}
TEXT_COLUMNS = {"timestamp", "uuid", "pstate", "name"}
MASK_COLUMNS = {"clocks_event_reasons.active"}


def smi_device_id(pci_bus_id: str = "", index: int | str = 0) -> str:
    """The --id nvidia-smi gets: the PCI bus id in nvidia-smi's own spelling
    (8-hex-digit domain: 00000000:18:00.0) since nvidia-smi ignores CUDA_VISIBLE_DEVICES;
    the index where the bus id is unknown."""
    m = re.fullmatch(r"([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)\.([0-7])",
                     (pci_bus_id or "").strip())
    if not m:
        return str(index)
    dom, bus, dev, fn = m.groups()
    return f"{int(dom, 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.{fn}"


def local_utc_offset_s(at: float | None = None) -> float:
    """UTC offset of this process's local time zone at unix time `at` (now by default)."""
    t = time.time() if at is None else at
    return dt.datetime.fromtimestamp(t).astimezone().utcoffset().total_seconds()


# -- nvidia-smi sampler --------------------------------------------------------------------
_LIVE: set[NvidiaSmiSampler] = set()  # samplers whose nvidia-smi may still run
_LIVE_LOCK = threading.Lock()


def _kill_live_samplers() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for s in live:
        s._terminate()


atexit.register(_kill_live_samplers)


class NvidiaSmiSampler:
    """nvidia-smi in loop mode for the whole job, stopped in after_job (the runner calls it
    in a `finally`). So that no nvidia-smi outlives its job:

    - it runs in its own session (a Ctrl-C of the terminal does not stop it early: the
      job's own cleanup does, after the last point);
    - under Linux it is started through `setpriv --pdeathsig TERM` when setpriv is there, so
      the kernel terminates it if the job process dies in any way (SIGKILL, segfault);
    - an atexit hook and a SIGTERM/SIGHUP handler (main thread only, chained to the handler
      that was there before; the default one becomes SystemExit so `finally` blocks run)
      stop it on interpreter exit and on termination.
    """

    def __init__(self, out_dir: Path, gpu_id: int | str, interval_ms: int = 100,
                 exe: str | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.gpu_id = str(gpu_id)  # what --id gets: PCI bus id (smi_device_id), UUID or index
        self.interval_ms = int(interval_ms)
        self.exe = exe if exe is not None else shutil.which("nvidia-smi")
        self.proc: subprocess.Popen | None = None
        self.unavailable: str = ""
        self.warnings: list[str] = []
        self.fields: list[str] = []
        self.t_launch = 0.0
        self.utc_offset_s: float | None = None
        self.n_rows = 0
        self.pid: int | None = None  # of the sampling nvidia-smi (stopped by after_job)
        self._stopped = False  # we stopped it (as opposed to: it died on its own)
        self._files: list[Any] = []
        self._old_handlers: dict[int, Any] = {}

    @property
    def csv_path(self) -> Path:
        return self.out_dir / "nvidia_smi.csv"

    # -- job hooks -----------------------------------------------------------------------
    def before_job(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if not self.exe:
            self.unavailable = "nvidia-smi not found on PATH"
            return
        self._snapshot("before")
        self.fields = self._supported_fields()
        (self.out_dir / "nvidia_smi_fields.txt").write_text(",".join(self.fields) + "\n")
        cmd = [
            self.exe,
            f"--query-gpu={','.join(self.fields)}",
            "--format=csv,nounits",
            f"--loop-ms={self.interval_ms}",
            f"--id={self.gpu_id}",
        ]
        cmd = _pdeathsig_prefix() + cmd
        out = open(self.csv_path, "w")  # noqa: SIM115 - closed in after_job
        err = open(self.out_dir / "nvidia_smi.stderr", "w")  # noqa: SIM115
        self._files = [out, err]
        env = dict(os.environ, TZ="UTC0")  # unambiguous times; the offset is measured anyway
        self.t_launch = time.time()
        try:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        except OSError as exc:
            self.unavailable = f"nvidia-smi could not be started: {exc}"
            self._close_files()
            return
        self.pid = self.proc.pid
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._install_signal_handlers()
        # the first sample lands before any work starts
        deadline = time.time() + max(0.3, 3 * self.interval_ms / 1000)
        while time.time() < deadline and self.proc.poll() is None:
            if self.csv_path.stat().st_size > 0 and _count_lines(self.csv_path) >= 2:
                break
            time.sleep(0.02)
        if self.proc.poll() is not None:
            self.unavailable = (f"nvidia-smi sampler exited at once (code "
                                f"{self.proc.returncode}): {self._stderr_text()}")

    def after_job(self) -> None:
        if self.proc is not None:
            early = None if self._stopped else self.proc.poll()
            self._terminate()
            if early is not None and not self.unavailable:
                self.warnings.append(f"nvidia-smi stopped during the job (code {early}): "
                                     f"{self._stderr_text()}")
            self._restore_signal_handlers()
            self._close_files()
            self._check_csv()
            self.proc = None
            if self.exe:
                self._snapshot("after")

    # -- helpers -------------------------------------------------------------------------
    def _terminate(self) -> None:
        """Stop nvidia-smi (SIGINT, as Ctrl-C would, then SIGKILL). Idempotent."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self._stopped = True
            try:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except OSError:
                pass
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._terminate()
        old = self._old_handlers.get(signum, signal.SIG_DFL)
        self._restore_signal_handlers()
        if callable(old):
            old(signum, frame)
        elif old == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):
                continue

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in list(self._old_handlers.items()):
            try:
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, old if old is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass
        self._old_handlers.clear()

    def _close_files(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def _stderr_text(self) -> str:
        try:
            for f in self._files:
                f.flush()
            return (self.out_dir / "nvidia_smi.stderr").read_text(errors="replace").strip()[:300]
        except OSError:
            return ""

    def _check_csv(self) -> None:
        """Count the samples and measure the offset of nvidia-smi's clock text from UTC."""
        try:
            df = parse_nvidia_smi_csv(self.csv_path.read_text(errors="replace"), utc_offset_s=0)
        except OSError as exc:
            self.unavailable = self.unavailable or f"nvidia-smi output unreadable: {exc}"
            return
        self.n_rows = len(df)
        if df.empty or df["t"].isna().all():
            self.unavailable = self.unavailable or (
                f"nvidia-smi wrote no samples: {self._stderr_text() or 'empty output'}")
            return
        self.utc_offset_s = infer_utc_offset(float(df["t"].dropna().iloc[0]), self.t_launch)

    def _supported_fields(self) -> list[str]:
        """Query names this driver knows, from `nvidia-smi --help-query-gpu`; without that
        list, the required fields are probed (new names first, then the pre-530 names)."""
        known: set[str] = set()
        try:
            out = subprocess.run([self.exe, "--help-query-gpu"], capture_output=True,
                                 text=True, timeout=30)
            if out.returncode == 0:
                known = parse_help_query_gpu(out.stdout)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if known:
            chosen = choose_fields(known)
            if chosen:
                return chosen
            self.warnings.append("--help-query-gpu lists none of the expected fields")
        for pick in (0, -1):
            fields = [c[pick] for c, required in FIELD_CANDIDATES.values() if required]
            probe = [self.exe, f"--query-gpu={','.join(fields)}", "--format=csv",
                     f"--id={self.gpu_id}"]
            try:
                if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
                    return fields
            except (OSError, subprocess.TimeoutExpired):
                break
        return fields

    def _snapshot(self, when: str) -> None:
        try:
            out = subprocess.run(
                [self.exe, "-q", "-x", f"--id={self.gpu_id}"],
                capture_output=True, text=True, timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.warnings.append(f"nvidia-smi -q -x ({when}) failed: {exc}")
            return
        if out.returncode != 0:
            self.warnings.append(f"nvidia-smi -q -x ({when}) exited {out.returncode}: "
                                 f"{out.stderr.strip()[:200]}")
        (self.out_dir / f"nvidia_smi_{when}.xml").write_text(out.stdout)

    def status(self) -> dict[str, Any]:
        return {
            "nvidia_smi": "ok" if not self.unavailable else "unavailable",
            "nvidia_smi_reason": self.unavailable,
            "nvidia_smi_warnings": list(self.warnings),
            "nvidia_smi_fields": list(self.fields),
            "nvidia_smi_samples": self.n_rows,
            "nvidia_smi_interval_ms": self.interval_ms,
            "nvidia_smi_id": self.gpu_id,
            "nvidia_smi_pid": self.pid,
            "nvidia_smi_utc_offset_s": self.utc_offset_s,
            "host_utc_offset_s": local_utc_offset_s(),
        }


def _pdeathsig_prefix() -> list[str]:
    """`setpriv --pdeathsig TERM --` where it works (util-linux >= 2.33): the kernel then
    terminates the sampler when the job process dies, even by SIGKILL."""
    exe = shutil.which("setpriv")
    if not exe:
        return []
    try:
        ok = subprocess.run([exe, "--pdeathsig", "TERM", "--", "true"], capture_output=True,
                            timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return [exe, "--pdeathsig", "TERM", "--"] if ok else []


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def parse_help_query_gpu(text: str) -> set[str]:
    """Field names of `nvidia-smi --help-query-gpu`: lines like `"clocks.current.sm" or
    "clocks.sm"`, each followed by its description."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith('"'):
            names.update(re.findall(r'"([A-Za-z0-9_.]+)"', line))
    return names


def choose_fields(known: set[str]) -> list[str]:
    """For each logical field the first query name the driver knows (optional fields are
    left out where it knows none; an empty list if a required one is missing)."""
    fields = []
    for cands, required in FIELD_CANDIDATES.values():
        hit = next((c for c in cands if c in known), None)
        if hit:
            fields.append(hit)
        elif required:
            return []
    return fields


def infer_utc_offset(first_t_as_utc: float, t_launch: float) -> float:
    """Offset of nvidia-smi's clock text from UTC: the first sample's time read as UTC minus
    the unix time of the launch, rounded to 15 minutes (the first sample comes well under
    7.5 minutes after launch; every real time zone is a multiple of 15 minutes)."""
    return float(round((first_t_as_utc - t_launch) / 900.0) * 900)


def parse_nvidia_smi_csv(text: str, utc_offset_s: float | None = None) -> pd.DataFrame:
    """Parse `nvidia-smi --query-gpu=... --format=csv[,nounits]` output into typed columns
    named by their logical names (FIELD_CANDIDATES; units dropped from the header).

    `timestamp` ("YYYY/MM/DD HH:MM:SS.mmm", the local time of the nvidia-smi process) becomes
    unix seconds in `t`: read with `utc_offset_s` (seconds east of UTC) when given, else as
    local time of this process. Values like '[N/A]' or '[Not Supported]' become NaN, the
    reasons bitmask (0x0000000000000004) an integer-valued float. Repeated header lines and
    short (torn) lines are dropped."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    if not rows:
        return pd.DataFrame(columns=["t", *QUERY_FIELDS])
    raw_header = [h.strip() for h in rows[0]]
    header = [_logical(h) for h in raw_header]
    body = [[c.strip() for c in r] for r in rows[1:]]
    body = [r for r in body if len(r) == len(header) and r != raw_header]
    df = pd.DataFrame(body, columns=header)
    tz = None if utc_offset_s is None else dt.timezone(dt.timedelta(seconds=utc_offset_s))
    df["t"] = [_smi_time(s, tz) for s in df["timestamp"]] if "timestamp" in df else float("nan")
    for col in df.columns:
        if col in TEXT_COLUMNS or col == "t":
            continue
        if col in MASK_COLUMNS:
            df[col] = [_hex_or_nan(v) for v in df[col]]
        else:
            df[col] = pd.to_numeric(df[col].str.replace(r"\s*(MHz|W|MiB|%|C)$", "",
                                                        regex=True), errors="coerce")
    return df


def _logical(header: str) -> str:
    name = header.split(" [")[0].strip()
    return HEADER_ALIASES.get(name, name)


def _smi_time(s: str, tz: dt.tzinfo | None) -> float:
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            d = dt.datetime.strptime(s, fmt)
        except ValueError:
            continue
        # naive = local time of this process (mktime, the host's TZ), like nvidia-smi's own
        return (d.replace(tzinfo=tz) if tz is not None else d).timestamp()
    return float("nan")


def _hex_or_nan(v: str) -> float:
    try:
        return float(int(v, 16))
    except (TypeError, ValueError):
        return float("nan")


def throttling_samples(df: pd.DataFrame, ratio: float = 0.85) -> pd.Series:
    """Per nvidia-smi sample: was the GPU throttled (same rule as is_throttled; samples with
    the GPU idle do not count, an idle GPU lowers its clock on purpose)?"""
    if df.empty or "clocks_event_reasons.active" not in df:
        return pd.Series(False, index=df.index)
    mask = df["clocks_event_reasons.active"]
    bits = mask.fillna(0).astype("int64")
    by_reason = (bits & THROTTLING_MASK) != 0
    idle = (bits & 0x1) != 0
    by_clock = pd.Series(False, index=df.index)
    if {"clocks.sm", "clocks.max.sm"} <= set(df.columns):
        by_clock = (df["clocks.sm"] < ratio * df["clocks.max.sm"]) & ~idle
    return (by_reason | by_clock.fillna(False)).astype(bool)



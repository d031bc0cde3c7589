"""What `make test` costs the machine: its wall time, the CPU seconds the whole machine was busy
while it ran (/proc/stat), and every JVM it started (sampled every half second from /proc: when
first seen, its CPU at the last sighting, what it was started as). Run it with nothing else
running, in a clone that `make test` has set up:

    .venv/bin/python benchmarks/suite.py [make test]

Writes benchmarks/results/suite.json.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from measure import save_results

TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_EVERY = 0.5


def busy_seconds() -> float:
    """CPU seconds the machine has spent busy (user, nice, system, irq, softirq, steal) since boot."""
    fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) / TICK


def jvms_now() -> dict[tuple[int, int], tuple[float, str]]:
    """(pid, start tick) -> (CPU seconds so far, its main class or script) of every running JVM."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or (proc / "comm").read_text().strip() != "java":
                continue
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # ended meanwhile
            continue
        main = next((arg for arg in args if arg.startswith("org.apache.spark.") and not arg.startswith("-")), "java")
        found[(int(proc.name), int(stat[19]))] = ((int(stat[11]) + int(stat[12])) / TICK, main)
    return found


def main() -> None:
    command = sys.argv[1:] or ["make", "test"]
    busy, started = busy_seconds(), time.monotonic()
    process = subprocess.Popen(command)
    jvms: dict[tuple[int, int], dict] = {}
    while process.poll() is None:
        for key, (cpu, what) in jvms_now().items():
            jvms.setdefault(key, {"first_seen": round(time.monotonic() - started, 1), "started_as": what})["cpu_seconds"] = cpu
        time.sleep(SAMPLE_EVERY)
    wall, busy = time.monotonic() - started, busy_seconds() - busy
    cpu = sorted(jvm["cpu_seconds"] for jvm in jvms.values())
    by_kind: dict[str, int] = {}
    for jvm in jvms.values():
        by_kind[jvm["started_as"]] = by_kind.get(jvm["started_as"], 0) + 1
    save_results("suite", {
        "command": " ".join(command),
        "exit_code": process.returncode,
        "wall_seconds": round(wall),
        "machine_busy_cpu_seconds": round(busy),
        "cores": os.cpu_count(),
        "busy_share_of_the_cores": round(busy / wall / os.cpu_count(), 2),
        "jvms_started": len(jvms),
        "jvms_by_main_class": by_kind,
        "jvm_cpu_seconds": round(sum(cpu)),
        "jvm_cpu_seconds_median": cpu[len(cpu) // 2] if cpu else None,
        "jvms": sorted(jvms.values(), key=lambda jvm: jvm["first_seen"]),
    })
    sys.exit(process.returncode)


if __name__ == "__main__":
    main()

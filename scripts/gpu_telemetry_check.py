#!/usr/bin/env python3
"""Compares ringsided's GPU telemetry with nvidia-smi on a GPU node.

Starts the given ringsided (GPU source on, scheduler off, a throwaway data dir), reads its
snapshot and /metrics, queries nvidia-smi for the same fields one at a time (a field this
nvidia-smi does not know is skipped, not fatal), and prints one Markdown table: field, what
Ringside says, what nvidia-smi says, and whether they agree. Fields that change from moment to
moment (power, clocks, temperature, utilisation) are compared within a tolerance; the rest must
be equal. Exits 1 if any field disagrees or a field is null without a reason.

usage: gpu_telemetry_check.py RINGSIDED [--snapshot-out FILE]
"""

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request

# (nvidia-smi field, snapshot field, how to turn nvidia-smi's text into the snapshot's unit,
#  how to compare: "equal", or a (relative, absolute) tolerance)
MIB = 1024 * 1024


def smi_number(text):
    return float(text.split()[0])


def smi_bool(text):
    return text.strip().lower() == "enabled"


def smi_mode(text):
    return text.strip().lower()


FIELDS = [
    ("uuid", "uuid", str.strip, "equal"),
    ("name", "name", str.strip, "equal"),
    ("pci.bus_id", "pci_bus_id", lambda t: t.strip().lower(), "equal_lower"),
    ("memory.total", "memory_total_bytes", lambda t: smi_number(t) * MIB, (0.0, MIB)),
    ("memory.used", "memory_used_bytes", lambda t: smi_number(t) * MIB, (0.05, 512 * MIB)),
    ("memory.free", "memory_free_bytes", lambda t: smi_number(t) * MIB, (0.05, 512 * MIB)),
    ("temperature.gpu", "temperature_gpu_c", smi_number, (0.0, 3.0)),
    ("temperature.memory", "temperature_memory_c", smi_number, (0.0, 3.0)),
    ("power.draw", "power_draw_w", smi_number, (0.25, 30.0)),
    ("enforced.power.limit", "power_limit_w", smi_number, (0.0, 1.0)),
    ("clocks.sm", "sm_clock_mhz", smi_number, (0.25, 50.0)),
    ("clocks.max.sm", "sm_clock_max_mhz", smi_number, (0.0, 0.5)),
    ("clocks.mem", "memory_clock_mhz", smi_number, (0.1, 50.0)),
    ("clocks.max.mem", "memory_clock_max_mhz", smi_number, (0.0, 0.5)),
    ("utilization.gpu", "utilization_gpu_pct", smi_number, (0.0, 30.0)),
    ("utilization.memory", "utilization_memory_pct", smi_number, (0.0, 30.0)),
    ("persistence_mode", "persistence_mode", smi_bool, "equal"),
    ("compute_mode", "compute_mode", smi_mode, "equal"),
    ("pstate", "performance_state", str.strip, "dynamic"),
    ("ecc.errors.corrected.volatile.total", "ecc_corrected_volatile", smi_number, (0.0, 0.5)),
    ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected_volatile", smi_number, (0.0, 0.5)),
    ("pcie.link.gen.current", None, str.strip, "info"),
    ("clocks_event_reasons.active", None, str.strip, "info"),
]


def start_daemon(binary, token, data_dir):
    config = os.path.join(data_dir, "ringside.toml")
    with open(config, "w") as f:
        # A CUDA canary makes ringsided itself a compute process NVML lists.
        f.write('[scheduler]\nenabled = false\n\n[gpu]\nmode = "on"\n\n'
                '[[kernels]]\nid = "gpu-canary"\nkernel = "echo"\nbackend = "cuda"\n')
    env = dict(os.environ, RINGSIDE_TOKEN=token, RINGSIDE_LOG="warn")
    proc = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--interval-ms", "500", "--config", config,
         "--data-dir", os.path.join(data_dir, "data")],
        stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("ringsided listening on "):
            return proc, line.split("listening on ", 1)[1].strip()
    proc.kill()
    raise SystemExit("ringsided did not print its address within 30 s")


def get(base, path, token):
    request = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def smi(field, index):
    result = subprocess.run(
        ["nvidia-smi", "-i", str(index), "--query-gpu=" + field, "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return None, (result.stdout + result.stderr).strip().splitlines()[-1:] or ["failed"]
    return result.stdout.strip(), None


def compare(ours, theirs, how):
    if how in ("info", "dynamic"):
        return "n/a"
    if ours is None:
        return "MISSING"
    if how == "equal":
        return "ok" if ours == theirs else "DIFFERS"
    if how == "equal_lower":
        return "ok" if str(ours).lower() == theirs else "DIFFERS"
    relative, absolute = how
    limit = max(abs(theirs) * relative, absolute)
    return "ok" if abs(float(ours) - theirs) <= limit else "DIFFERS"


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    binary = sys.argv[1]
    snapshot_out = sys.argv[sys.argv.index("--snapshot-out") + 1] if "--snapshot-out" in sys.argv else None
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as scratch:
        proc, base = start_daemon(binary, token, scratch)
        try:
            # A reading taken a second after the CUDA canary runs (NVML is sampled on its own
            # thread from the start, before the canary holds the device): its process, memory
            # and utilisation are then in it, as they are in what nvidia-smi says next.
            snapshot = None
            canary_at_ms = None
            deadline = time.time() + 30
            while time.time() < deadline:
                snapshot = json.loads(get(base, "/api/snapshot", token))
                gpus = snapshot.get("gpus") or {}
                if gpus.get("available") is False and gpus.get("reason"):
                    break
                canary = next((k for k in snapshot["kernels"] if k["id"] == "gpu-canary"), None)
                if canary_at_ms is None and canary and canary["state"] == "active" and canary["messages_processed"] > 0:
                    canary_at_ms = snapshot["taken_at_ms"]
                if canary and canary["backend"] != "cuda":
                    print(f"the CUDA canary runs on {canary['backend']}: {canary.get('last_error')}")
                    canary_at_ms = canary_at_ms or snapshot["taken_at_ms"]
                if canary_at_ms and (gpus.get("sampled_at_ms") or 0) > canary_at_ms + 1000:
                    break
                time.sleep(0.25)
            metrics = get(base, "/metrics", token)
            # nvidia-smi is asked while ringsided (and its CUDA canary) still runs.
            return report(snapshot, metrics, proc.pid, snapshot_out)
        finally:
            proc.terminate()
            proc.wait(timeout=15)


def report(snapshot, metrics, daemon_pid, snapshot_out):
    failures = 0
    if snapshot_out:
        with open(snapshot_out, "w") as f:
            json.dump(snapshot, f, indent=1)
    gpus = snapshot.get("gpus") or {}
    component = next((c for c in snapshot["components"] if c["name"] == "gpu"), None)
    print(f"GPU source: available={gpus.get('available')} reason={gpus.get('reason')} "
          f"component={component} driver={gpus.get('driver_version')} cuda={gpus.get('cuda_driver_version')} "
          f"nvml={gpus.get('nvml_version')} xid_events={gpus.get('xid_events')}")
    if not gpus.get("available") or not gpus.get("devices"):
        print("gpu-telemetry: FAILED: the GPU source has no reading")
        return 1
    smi_driver, _ = smi("driver_version", 0)
    print()
    print("| GPU | field | Ringside | nvidia-smi | agrees |")
    print("|---|---|---|---|---|")
    row = lambda *cells: print("| " + " | ".join(str(c) for c in cells) + " |")
    verdict = "ok" if smi_driver == gpus.get("driver_version") else "DIFFERS"
    failures += verdict != "ok"
    row("all", "driver_version", gpus.get("driver_version"), smi_driver, verdict)
    for device in gpus["devices"]:
        index = device["index"]
        for smi_field, ours_field, convert, how in FIELDS:
            text, error = smi(smi_field, index)
            ours = device.get(ours_field) if ours_field else None
            shown = ours
            if ours is None and ours_field:
                shown = "null (" + device.get("unsupported", {}).get(ours_field, "NO REASON") + ")"
                if ours_field not in device.get("unsupported", {}):
                    failures += 1
            if text is None or text in ("[N/A]", "N/A", "[Not Supported]"):
                verdict = "n/a" if ours is None else "(smi: " + (text or " ".join(error)) + ")"
                row(index, ours_field or smi_field, shown, text or " ".join(error), verdict)
                continue
            try:
                theirs = convert(text)
            except (ValueError, IndexError):
                row(index, ours_field or smi_field, shown, text, "n/a")
                continue
            verdict = compare(ours, theirs, how) if ours_field else "n/a"
            failures += verdict in ("DIFFERS", "MISSING")
            row(index, ours_field or smi_field, shown, text, verdict)
        for field in ("throttle_reasons", "pcie_replay_count", "nvlink_links", "nvlink_tx_bytes",
                      "remapped_rows_correctable", "remapped_rows_uncorrectable", "retired_pages",
                      "energy_j", "numa_node", "compute_capability"):
            value = device.get(field)
            shown = value if value is not None else "null (" + device.get("unsupported", {}).get(field, "NO REASON") + ")"
            if value is None and field not in device.get("unsupported", {}):
                failures += 1
            row(index, field, shown, "", "")
    # Compute processes: ringsided's own CUDA canary must be among them, with its memory.
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    smi_apps = {}
    for line in apps.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].isdigit():
            smi_apps[(parts[0], int(parts[1]))] = parts[2]
    ours_apps = {(d["uuid"], p["pid"]): p for d in gpus["devices"] for p in d.get("processes", [])}
    print()
    print(f"compute processes: nvidia-smi {sorted(smi_apps)} / Ringside "
          f"{sorted((k, v.get('gpu_memory_bytes'), v.get('sm_utilization_pct')) for k, v in ours_apps.items())}")
    if not any(pid == daemon_pid for (_, pid) in ours_apps):
        failures += 1
        print(f"gpu-telemetry: FAILED: ringsided (pid {daemon_pid}) runs a CUDA kernel but is not among its GPU's processes")
    for key, used_mib in smi_apps.items():
        ours = ours_apps.get(key)
        if key[1] == daemon_pid and (ours is None or ours.get("gpu_memory_bytes") is None
                                     or abs(ours["gpu_memory_bytes"] / MIB - float(used_mib)) > 2):
            failures += 1
            print(f"gpu-telemetry: FAILED: process {key} memory {ours} vs nvidia-smi {used_mib} MiB")
    series = sorted({line.split("{")[0] for line in metrics.splitlines() if line.startswith("ringside_gpu_")})
    print()
    print(f"/metrics GPU families ({len(series)}): {', '.join(series)}")
    if "ringside_gpu_utilization_ratio" not in series:
        failures += 1
        print("gpu-telemetry: FAILED: no ringside_gpu_utilization_ratio in /metrics")
    print(f"gpu-telemetry: {'passed' if failures == 0 else f'FAILED ({failures} disagreements)'}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

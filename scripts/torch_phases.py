#!/usr/bin/env python3
"""Real PyTorch under ringsided: a training loop on the CPU, scored against its own ground truth.

Not part of `cargo xtask test` (PyTorch with its CUDA libraries is about 5 GB). Run it beside a
daemon, with NVIDIA's driver library on the loader's path so that `torch.cuda.is_available()`
loads the real `libcuda.so.1` (no GPU: it answers False):

    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch
    RINGSIDE_TOKEN=... target/release/ringsided &
    LD_LIBRARY_PATH=~/.cache/ringside/nvidia/lib /tmp/torchenv/bin/python scripts/torch_phases.py \
        --url http://127.0.0.1:9650 --token ... --seconds 40

The loop: a DataLoader with two worker processes reading and decoding files (data loading, for
the main thread: waiting for the next batch), then forward, backward and an Adam step of an MLP
on the CPU. Each interval is logged; at the end the daemon's timeline of this process is scored
against them, leaving out the first window of each interval. What a CPU loop must show: waiting
for batches is data loading, and CPU compute is never taken for feeding a GPU (gpu_compute),
whatever the process maps. Prints one JSON object.
"""

import argparse
import json
import os
import tempfile
import time
import urllib.request

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Files(Dataset):
    """Samples stored one per file, decoded and augmented in the worker."""

    def __init__(self, directory, count):
        self.paths = [os.path.join(directory, f"{i}.npy") for i in range(count)]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        x = np.load(self.paths[i]).astype(np.float32)
        # Decoding work, as an image pipeline's would be.
        for _ in range(int(os.environ.get("DECODE_ROUNDS", "800"))):
            x = np.tanh(x * 1.01 + 0.01)
        return torch.from_numpy(x[:1024]), torch.tensor(i % 10)


def snapshot(url, token):
    request = urllib.request.Request(f"{url}/api/snapshot", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.load(reply)


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--url", required=True)
    args.add_argument("--token", required=True)
    args.add_argument("--seconds", type=float, default=40)
    args.add_argument("--window-ms", type=int, default=100)
    a = args.parse_args()

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as directory:
        for i in range(512):
            np.save(os.path.join(directory, f"{i}.npy"), np.random.rand(64 * 1024).astype(np.float32))
        loader = DataLoader(Files(directory, 512), batch_size=64, num_workers=2, shuffle=True, persistent_workers=True)
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
            torch.nn.Linear(2048, 10),
        )
        optimizer = torch.optim.Adam(model.parameters())
        truth = []
        started = time.time()
        while time.time() - started < a.seconds:
            batches = iter(loader)
            while time.time() - started < a.seconds:
                t0 = time.time()
                try:
                    x, y = next(batches)
                except StopIteration:
                    break
                t1 = time.time()
                for _ in range(int(os.environ.get("STEPS_PER_BATCH", "8"))):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                t2 = time.time()
                truth.append(("data_loading", t0, t1))
                truth.append(("cpu_compute", t1, t2))
        time.sleep(1.5)
        s = snapshot(a.url, a.token)

    me = next((p for p in s["scheduler"]["processes"] if p["pid"] == os.getpid()), None)
    if me is None:
        print(json.dumps({"error": "this process is not tracked", "pid": os.getpid()}))
        return 1
    spans = [(p["phase"], p["start_ms"] / 1000, p["end_ms"] / 1000) for p in me["timeline"]]
    skip = a.window_ms / 1000
    scores = {}
    for label in ("data_loading", "cpu_compute"):
        total, by_phase = 0.0, {}
        for phase, start, end in ((t, s0 + skip, e) for t, s0, e in truth if t == label):
            if end <= start:
                continue
            total += end - start
            for p, s1, e1 in spans:
                overlap = min(end, e1) - max(start, s1)
                if overlap > 0:
                    by_phase[p] = by_phase.get(p, 0.0) + overlap
        lengths = [e - s0 for t, s0, e in truth if t == label]
        scores[label] = {
            "intervals": len(lengths),
            "mean_s": round(sum(lengths) / max(len(lengths), 1), 3),
            "scored_s": round(total, 2),
            "detected_pct": {p: round(v * 100 / total, 1) for p, v in by_phase.items()} if total else {},
        }
    print(json.dumps({
        "torch": torch.__version__,
        "cuda_available": cuda,
        "libraries": [(l["path"].rsplit("/", 1)[-1], l["state"], l["detail"]) for l in me["libraries"]],
        "reason": me["reason"],
        "scores": scores,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Probe: the SM clock and the power each provider runs at, in steady loops of the headline cells.

The H200 runs against its power cap under these kernels. A ratio of TFLOPS against cuDNN is then the product of
two ratios: the clock each provider's loop settles at, and the work a provider does a cycle. This probe separates
them: each provider runs a cell in a loop of about WINDOW_S seconds (calls queued in batches of ~0.25 s, a sync
between batches), windows in the order cuDNN, diyflash, diyflash, cuDNN, while a sampler process reads NVML every
10 ms (SM clock, power, temperature, the clock event reasons). The window's energy comes from NVML's energy
counter, read after a sync at both ends.

    python bench/probes/drafts/power_clock/probe.py --out $OUT/power_clock.jsonl
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

WINDOW_S = 1.5
BATCH_S = 0.25
SAMPLE_S = 0.01


class Nvml:
    """The few NVML calls the probe needs, through ctypes (no pynvml dependency)."""

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._ok(self.lib.nvmlInit_v2())
        self.handle = ctypes.c_void_p()
        self._ok(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)))

    @staticmethod
    def _ok(rc):
        if rc != 0:
            raise RuntimeError(f"NVML error {rc}")

    def _uint(self, fn, *args):
        out = ctypes.c_uint()
        self._ok(fn(self.handle, *args, ctypes.byref(out)))
        return out.value

    def _ull(self, fn, *args):
        out = ctypes.c_ulonglong()
        self._ok(fn(self.handle, *args, ctypes.byref(out)))
        return out.value

    def sm_mhz(self):
        return self._uint(self.lib.nvmlDeviceGetClockInfo, 1)  # NVML_CLOCK_SM

    def power_mw(self):
        return self._uint(self.lib.nvmlDeviceGetPowerUsage)

    def temp_c(self):
        return self._uint(self.lib.nvmlDeviceGetTemperature, 0)  # NVML_TEMPERATURE_GPU

    def energy_mj(self):
        return self._ull(self.lib.nvmlDeviceGetTotalEnergyConsumption)

    def reasons(self):
        fn = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self.lib.nvmlDeviceGetCurrentClocksThrottleReasons
        return self._ull(fn)

    def power_limit_mw(self):
        return self._uint(self.lib.nvmlDeviceGetEnforcedPowerLimit)


def sampler(path: str, stop) -> None:
    nv = Nvml()
    with open(path, "w") as f:
        while not stop.is_set():
            f.write(f"{time.monotonic()} {nv.sm_mhz()} {nv.power_mw()} {nv.temp_c()} {nv.reasons()}\n")
            time.sleep(SAMPLE_S)


def window(nv: Nvml, bench, per_call_s: float) -> dict:
    import torch

    batch = max(1, int(BATCH_S / per_call_s))
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0, j0 = time.monotonic(), nv.energy_mj()
    e0.record()
    calls = 0
    while time.monotonic() - t0 < WINDOW_S:
        for _ in range(batch):
            bench()
        calls += batch
        torch.cuda.synchronize()
    e1.record()
    torch.cuda.synchronize()
    t1, j1 = time.monotonic(), nv.energy_mj()
    return dict(calls=calls, gpu_ms=e0.elapsed_time(e1), t0=t0, t1=t1, energy_j=(j1 - j0) / 1e3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cells", nargs="+", default=None)
    parser.add_argument("--modes", nargs="+", default=["fwd", "bwd"])
    args = parser.parse_args(argv)

    samples_path = args.out + ".samples"
    stop = mp.Event()
    proc = mp.Process(target=sampler, args=(samples_path, stop), daemon=True)
    proc.start()  # forked before CUDA is touched

    import torch

    sys.path.insert(0, os.getcwd())
    from bench.attention import inputs, prepare
    from bench.cells import CELLS, cell_flops, providers
    from bench.common import DTYPES, provenance

    nv = Nvml()
    names = args.cells or [n for n in CELLS if CELLS[n][7] is None]
    rows = []
    for name in names:
        b, h, h_kv, n, d, causal, dname, _ = CELLS[name]
        q, k, v = inputs(b, h, h_kv, n, d, DTYPES[dname], "bhnd")
        found, _ = providers(name)
        for mode in args.modes:
            benches = {p: prepare(found[p], q, k, v, causal, mode) for p in ("cudnn", "diyflash")}
            per_call = {}
            for p, fn in benches.items():  # one call's time, for the batch size
                torch.cuda.synchronize()
                t = time.monotonic()
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                per_call[p] = (time.monotonic() - t) / 3
            for i, p in enumerate(("cudnn", "diyflash", "diyflash", "cudnn")):
                w = window(nv, benches[p], per_call[p])
                w.update(cell=name, mode=mode, provider=p, order=i,
                         tflops=cell_flops(name, mode) * w["calls"] / (w["gpu_ms"] / 1e3) / 1e12)
                rows.append(w)
                print(f"{name} {mode} {p}: {w['tflops']:.0f} TFLOPS, {w['energy_j'] / (w['t1'] - w['t0']):.0f} W",
                      flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    stop.set()
    proc.join(timeout=5)

    samples = []
    with open(samples_path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 5:
                samples.append((float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4])))
    limit_w = nv.power_limit_mw() / 1e3
    prov = provenance()
    with open(args.out, "w") as f:
        for w in rows:
            inside = [s for s in samples if w["t0"] + 0.1 <= s[0] <= w["t1"]]  # past the window's first 0.1 s
            reasons = 0
            for s in inside:
                reasons |= s[4]
            seconds = w["t1"] - w["t0"]
            w.update(sm_mhz=statistics.mean(s[1] for s in inside) if inside else None,
                     power_w=w["energy_j"] / seconds, power_limit_w=limit_w,
                     power_w_sampled=statistics.mean(s[2] for s in inside) / 1e3 if inside else None,
                     temp_c=max(s[3] for s in inside) if inside else None, reasons=hex(reasons),
                     samples=len(inside), tflop_per_j=cell_flops(w["cell"], w["mode"]) * w["calls"] / 1e12 / w["energy_j"],
                     **prov)
            w["tflops_per_ghz"] = w["tflops"] / (w["sm_mhz"] / 1e3) if w["sm_mhz"] else None
            for key in ("t0", "t1"):
                w.pop(key)
            f.write(json.dumps(w) + "\n")
    os.remove(samples_path)

    # the table: medians of each provider's two windows, diyflash against cuDNN
    print(f"\npower limit {limit_w:.0f} W")
    print("| cell | mode | TFLOPS ratio | clock cuDNN / diyflash (MHz) | clock ratio | per-cycle ratio | power W "
          "cuDNN / diyflash | TFLOP per J ratio |")
    print("|---|---|---|---|---|---|---|---|")
    keyed = {}
    for w in rows:
        keyed.setdefault((w["cell"], w["mode"]), {}).setdefault(w["provider"], []).append(w)
    for (cell, mode), by in keyed.items():
        med = {p: {k: statistics.median(x[k] for x in ws) for k in ("tflops", "sm_mhz", "power_w", "tflop_per_j",
                                                                      "tflops_per_ghz")} for p, ws in by.items()}
        c, o = med["cudnn"], med["diyflash"]
        print(f"| {cell} | {mode} | {o['tflops'] / c['tflops']:.3f} | {c['sm_mhz']:.0f} / {o['sm_mhz']:.0f} | "
              f"{o['sm_mhz'] / c['sm_mhz']:.3f} | {o['tflops_per_ghz'] / c['tflops_per_ghz']:.3f} | "
              f"{c['power_w']:.0f} / {o['power_w']:.0f} | {o['tflop_per_j'] / c['tflop_per_j']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

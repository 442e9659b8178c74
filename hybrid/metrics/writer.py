"""Where a run's numbers go besides the log line: TensorBoard (`--tensorboard-dir`, Megatron's scalar names) and a
JSON-lines file (`--metrics-file`, one object per log interval or evaluation). Rank 0 writes; every other rank
holds a writer that does nothing."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass

from hybrid.metrics.flops import model_flops_per_token, hardware_flops_per_token

# our field -> Megatron's TensorBoard tag
TB_NAMES = {"lm_loss": "lm loss", "lr": "learning-rate", "grad_norm": "grad-norm", "loss_scale": "loss-scale",
            "iteration_time_s": "iteration-time", "tflops_per_device": "throughput", "tokens_per_s": "tokens-per-sec",
            "mfu": "mfu", "consumed_samples": "consumed-samples", "skipped_iterations": "skipped-iterations",
            "max_memory_allocated_bytes": "mem-max-allocated-bytes", "peak_rss_bytes": "mem-peak-rss-bytes"}


@dataclass
class StepRates:
    """Throughput of one log interval.

    Attributes:
        tokens_per_s: tokens trained per second over all devices (global batch x seq / step time).
        tflops_per_device: model TFLOP/s per device (flops.model_flops_per_token x tokens/s / world).
        hw_tflops_per_device: the same counting recomputed forwards (flops.hardware_flops_per_token).
        mfu: tflops_per_device / the device's peak (None when the peak is unknown).
    """

    tokens_per_s: float
    tflops_per_device: float
    hw_tflops_per_device: float
    mfu: float | None


def step_rates(cfg, seq_length: int, tokens_per_step: int, step_s: float, world: int, recompute: str,
               peak_tflops: float | None) -> StepRates:
    tps = tokens_per_step / step_s
    model = model_flops_per_token(cfg, seq_length) * tps / world / 1e12
    hw = hardware_flops_per_token(cfg, seq_length, recompute) * tps / world / 1e12
    return StepRates(tps, model, hw, model / peak_tflops if peak_tflops else None)


def drop_torn_record(path: str, chunk: int = 1 << 16) -> None:
    """Cut an appended --metrics-file back to its last whole line. A run killed inside a record's write (a long
    line of per-rank lists spans several write() calls; a full disk stops one midway) leaves a torn last line,
    and the resumed run's first record would be appended to it: one line that is not JSON, which makes the whole
    file unreadable to plot_run. Only the bytes after the last newline go -- never a whole record."""
    if not os.path.isfile(path):
        return
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        at = end
        while at > 0:  # backwards, a chunk at a time, to the last newline
            start = max(0, at - chunk)
            f.seek(start)
            nl = f.read(at - start).rfind(b"\n")
            if nl >= 0:
                at = start + nl + 1
                break
            at = start
        if 0 < at < end:  # no newline at all: not a file a run wrote (check_appendable refuses it)
            f.truncate(at)
            print(f"note: --metrics-file {path}: its last {end - at} bytes were a torn record (a killed run's last "
                  f"write), cut; the whole records before it are kept", file=sys.stderr, flush=True)


class MetricsWriter:
    """TensorBoard and/or JSON lines, on rank 0 (`enabled`); `close()` flushes both. Both are opened at the first
    record, not here: train.py builds the writer before the resume, and a resume refused there (a corrupted
    checkpoint, a NaN outer state: after the process groups start) left an empty --metrics-file and a TensorBoard
    folder with an empty event file behind (round 18) -- a run that wrote nothing now leaves nothing."""

    def __init__(self, tensorboard_dir: str | None, metrics_file: str | None, enabled: bool):
        self.tb = self.file = None
        self._paths = (tensorboard_dir, metrics_file) if enabled else (None, None)

    def _open(self) -> None:
        tensorboard_dir, metrics_file = self._paths
        self._paths = (None, None)
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(log_dir=tensorboard_dir, max_queue=1000)
        if metrics_file:
            drop_torn_record(metrics_file)
            self.file = open(metrics_file, "a", buffering=1)  # a line per record, appended across resumes

    def write(self, iteration: int, values: dict[str, float | int | list | None]) -> None:
        """Scalars to TensorBoard and everything (lists too: per-rank values) to the JSON line."""
        self._open()  # the first record opens both (nothing when already open)
        values = {k: v for k, v in values.items() if v is not None}
        if self.tb is not None:
            for key, value in values.items():
                if not isinstance(value, list):  # per-rank lists stay in the JSON file
                    self.tb.add_scalar(TB_NAMES.get(key, key), value, iteration)
        if self.file is not None:
            clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in values.items()}
            self.file.write(json.dumps({"iteration": iteration, **clean}) + "\n")

    def write_eval(self, iteration: int, losses: dict[str, float]) -> None:
        """Megatron's tags: 'lm loss validation', 'lm loss validation ppl' (and 'test')."""
        values = {}
        for name, loss in losses.items():
            split = "test" if "test" in name else "validation"
            values[f"lm loss {split}"] = loss
            values[f"lm loss {split} ppl"] = math.exp(min(20.0, loss))
        if values:
            self.write(iteration, values)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.file is not None:
            self.file.close()

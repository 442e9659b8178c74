"""The training loop's metrics: the fields appended to each log line and the records written to TensorBoard /
JSON lines (hybrid/train/loop.py calls `log_interval` and `write_eval`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid.metrics.flops import device_peak_tflops
from hybrid.metrics.peak_memory import MemoryMeasure, gather_peaks, measure_for, memory_field
from hybrid.metrics.writer import MetricsWriter, step_rates


@dataclass
class RunMetrics:
    cfg: object
    seq_length: int
    global_batch: int
    world: int
    recompute: str
    peak_tflops: float | None
    peak_source: str | None
    train_iters: int
    device: torch.device
    memory: MemoryMeasure
    writer: MetricsWriter
    peaks_group: object = None  # the Group the memory peaks are gathered over (Mesh.world)
    timing_every: int = 1

    @classmethod
    def start(cls, run, cfg, batch, mesh) -> "RunMetrics":
        """For a run (hybrid.train.config.RunConfig): its metrics config, recomputation and length."""
        m = run.metrics
        peak, source = m.peak_tflops, m.peak_source
        if peak is None and mesh.device.type == "cuda":
            name = torch.cuda.get_device_name(mesh.device)
            peak, source = device_peak_tflops(name), f"{name}, bf16 dense peak (hybrid/metrics/flops.py)"
        return cls(cfg, batch.seq_length, batch.global_batch, mesh.dims.world, run.model.recompute.value,
                   peak, source, run.training.train_iters, mesh.device, measure_for(mesh.device),
                   MetricsWriter(m.tensorboard_dir, m.metrics_file, mesh.rank == 0), mesh.world,
                   m.timing_log_interval)

    def header(self) -> str:
        """The run's metrics line: what MFU divides by, and which memory measure the lines show."""
        mfu = (f"MFU against {self.peak_tflops:.4g} TFLOP/s per rank ({self.peak_source})" if self.peak_tflops
               else "no MFU (unknown device peak: --hardware PROFILE or --peak-tflops X)")
        every = ("every log interval" if self.timing_every == 1 else
                 f"every {self.timing_every} log intervals and when a straggler is named or a step skipped")
        return (f"metrics: {mfu} | memory: {self.memory.label} per rank, peak since start | per-rank step times, "
                f"time split, straggler verdict: {every} (--timing-log-interval)")

    def log_interval(self, iteration: int, step_s: float, loss: float, lr: float, report, skipped: int,
                     extra: dict | None = None, consumed: int | None = None) -> str:
        """' | consumed samples N | X TFLOP/s/device (hw Y) | MFU Z% | peak RSS M MiB (...) | ETA' for the log
        line; records the interval. Collective (the memory all-gather): every rank calls it. consumed: the samples
        read through this iteration, the loop's count (a run resumed at another global batch read the checkpoint's
        first ones at the old batch: iteration x global batch overstated them); None: iteration x global batch."""
        rates = step_rates(self.cfg, self.seq_length, self.global_batch * self.seq_length, step_s, self.world,
                           self.recompute, self.peak_tflops)
        peaks = gather_peaks(self.device, self.peaks_group)
        consumed = iteration * self.global_batch if consumed is None else consumed
        self.writer.write(iteration, {
            "consumed_samples": consumed, "lm_loss": loss, "lr": lr, "grad_norm": report.grad_norm,
            "loss_scale": report.loss_scale, "skipped_iterations": skipped, "iteration_time_s": step_s,
            "tokens_per_s": rates.tokens_per_s, "tflops_per_device": rates.tflops_per_device,
            "hw_tflops_per_device": rates.hw_tflops_per_device, "mfu": rates.mfu,
            self.memory.key: max(peaks), f"{self.memory.key}_per_rank": peaks, **(extra or {})})  # extra: MoE
        hw = f" (hw {rates.hw_tflops_per_device:.3g})" if self.recompute != "none" else ""
        mfu = f" | MFU {100 * rates.mfu:.2f}%" if rates.mfu is not None else ""
        eta = (self.train_iters - iteration) * step_s
        return (f" | consumed samples {consumed} | {rates.tflops_per_device:.3g} TFLOP/s/device{hw}{mfu}"
                f"{memory_field(peaks, self.memory)}"
                f" | ETA {int(eta // 3600)}:{int(eta % 3600 // 60):02d}:{int(eta % 60):02d}")

    def write_eval(self, iteration: int, losses: dict[str, float]) -> None:
        self.writer.write_eval(iteration, losses)

    def close(self) -> None:
        self.writer.close()

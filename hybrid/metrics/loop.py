"""The training loop's metrics: the fields appended to each log line and the records written to TensorBoard /
JSON lines (hybrid/train/loop.py calls `log_interval` and `write_eval`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid.metrics.flops import device_peak_tflops
from hybrid.metrics.writer import MetricsWriter, step_rates


@dataclass
class RunMetrics:
    cfg: object
    seq_length: int
    global_batch: int
    world: int
    recompute: str
    peak_tflops: float | None
    train_iters: int
    writer: MetricsWriter

    @classmethod
    def start(cls, args, cfg, batch, mesh) -> "RunMetrics":
        m = args.metrics
        peak = m.peak_tflops
        if peak is None and mesh.device.type == "cuda":
            peak = device_peak_tflops(torch.cuda.get_device_name(mesh.device))
        return cls(cfg, batch.seq_length, batch.global_batch, mesh.dims.world, args.recompute_granularity or "none",
                   peak, args.train_iters, MetricsWriter(m.tensorboard_dir, m.metrics_file, mesh.rank == 0))

    def log_interval(self, iteration: int, step_s: float, loss: float, lr: float, report, skipped: int) -> str:
        """' | consumed samples N | X TFLOP/s/device (hw Y) | MFU Z% | ETA' for the log line; records the interval."""
        rates = step_rates(self.cfg, self.seq_length, self.global_batch * self.seq_length, step_s, self.world,
                           self.recompute, self.peak_tflops)
        consumed = iteration * self.global_batch
        self.writer.write(iteration, {
            "consumed_samples": consumed, "lm_loss": loss, "lr": lr, "grad_norm": report.grad_norm,
            "loss_scale": report.loss_scale, "skipped_iterations": skipped, "iteration_time_s": step_s,
            "tokens_per_s": rates.tokens_per_s, "tflops_per_device": rates.tflops_per_device,
            "hw_tflops_per_device": rates.hw_tflops_per_device, "mfu": rates.mfu})
        hw = f" (hw {rates.hw_tflops_per_device:.3g})" if self.recompute != "none" else ""
        mfu = f" | MFU {100 * rates.mfu:.2f}%" if rates.mfu is not None else ""
        eta = (self.train_iters - iteration) * step_s
        return (f" | consumed samples {consumed} | {rates.tflops_per_device:.3g} TFLOP/s/device{hw}{mfu}"
                f" | ETA {int(eta // 3600)}:{int(eta % 3600 // 60):02d}:{int(eta % 60):02d}")

    def write_eval(self, iteration: int, losses: dict[str, float]) -> None:
        self.writer.write_eval(iteration, losses)

    def close(self) -> None:
        self.writer.close()

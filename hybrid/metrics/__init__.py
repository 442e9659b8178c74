"""Throughput, FLOPs and MFU of a run (flops.py), and where its metrics go: the log line, TensorBoard and a
JSON-lines file (writer.py). Flags in args.py."""

from hybrid.metrics.flops import device_peak_tflops, hardware_flops_per_token, model_flops_per_token

__all__ = ["device_peak_tflops", "hardware_flops_per_token", "model_flops_per_token"]

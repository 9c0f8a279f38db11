"""The built-in losses, one file each (minbert.core.losses.Loss; chosen by name: docs/finetuning.md)."""

"""The built-in heads, one file each (minbert.model.blocks.Head; chosen by name: docs/finetuning.md)."""

"""minbert: the library of the multi-task BERT pipeline (encoder, data, training, evaluation, reports)."""
import os as _os

# OpenMP threads that spin while they wait take the cores from the threads doing the work whenever
# the machine runs anything else (jobs side by side, a shared machine): on 2 busy cores torch's
# training step ran 6-10x slower and an evaluation pass 5x slower with the spinning default
# (bench/README.md, "Threads on busy cores"). Waiting threads sleep instead, unless the environment
# says otherwise; OpenMP reads this once, when torch loads it, so it is set before any import of torch.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

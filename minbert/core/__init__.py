"""The ground floor: errors, bounded file reading and atomic writes, the task registry and its
metrics, the results layout, and the runtime (device, precision, threads, seeds). Imports nothing
else of the project."""

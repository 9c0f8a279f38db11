"""What a `device` and a `precision` setting may say: the params schema offers these choices, the
command line's `--device` too, and minbert.core.runtime acts on them (refusing anything else, from
the API as from the command line: `check_device`). Apart from the runtime so that reading params
never imports torch."""
from minbert.core.errors import MinBertError

DEVICES = ("auto", "cpu", "cuda")           # auto: CUDA when there is a GPU
PRECISIONS = ("auto", "bf16", "fp16", "fp32")   # auto: bf16 where it is native, fp16 on a CUDA GPU without it
                                               # (minbert.core.runtime.precision_on)


def check_device(setting) -> str:
    """`setting` when it is a device the project runs on (`DEVICES`); a one-line error otherwise (a
    `tpu`, or `cuda:9`, is never quietly taken for the CPU)."""
    if isinstance(setting, str) and setting in DEVICES:
        return setting
    raise MinBertError(f"device {repr(setting)[:80]}: expected one of {', '.join(DEVICES)} (auto: cuda when there "
                       f"is a GPU, else cpu)")

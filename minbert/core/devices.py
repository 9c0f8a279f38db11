"""What a `device` and a `precision` setting may say: the params schema offers these choices and
minbert.core.runtime acts on them. Apart from the runtime so that reading params never imports torch."""

DEVICES = ("auto", "cpu", "cuda")           # auto: CUDA when there is a GPU
PRECISIONS = ("auto", "bf16", "fp16", "fp32")   # auto: bf16 where it is native, fp16 on a CUDA GPU without it
                                               # (minbert.core.runtime.precision_on)

"""One-line messages for bad params: the nearest valid name for a typo, and a pydantic error as
one line that names the key. The bottom of minbert.params: the schema and every step above it
report through these."""
from __future__ import annotations

from pydantic import BaseModel, ValidationError

from minbert.core.errors import MinBertError, close

# keys an earlier version read -> what replaced them (said in the error instead of a bare "unknown key")
RENAMED = {"bf16": "use 'precision' (auto | bf16 | fp16 | fp32): bf16: true -> precision: bf16, bf16: false -> "
                   "precision: fp32, or precision: auto for bf16 wherever it is native"}


def _key_path(loc) -> str:
    return ".".join(str(p) for p in loc)


def suggest(model_cls, loc, bad_key) -> str:
    """Nearest valid key at the location of an unknown key."""
    cls = model_cls
    for part in loc[:-1]:
        field = getattr(cls, "model_fields", {}).get(part)
        if field is None:
            return ""
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            cls = ann
        else:
            return ""
    return close(bad_key, getattr(cls, "model_fields", {}))


def raise_validation(err: ValidationError, model_cls, where: str, prefix: str = "") -> None:
    """Raise the first error of a pydantic validation as one line: the file, the dotted key (after
    `prefix`), what is wrong and the value given; an unknown key with the nearest known one."""
    e = err.errors()[0]
    loc = tuple(e["loc"])
    key = prefix + _key_path(loc)
    if e["type"] == "extra_forbidden" and loc and loc[-1] in RENAMED:
        raise MinBertError(f"{where}: key '{key}' is no longer read; {RENAMED[loc[-1]]}") from None
    if e["type"] == "extra_forbidden":
        raise MinBertError(f"{where}: unknown key '{key}'{suggest(model_cls, loc, loc[-1] if loc else '')}") from None
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    got_s = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) else ""
    raise MinBertError(f"{where}: key '{key}': {msg}{got_s}") from None

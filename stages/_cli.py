"""How every stage CLI ends: one-line user errors and exit codes (arguments and jobs: minbert.pipeline.stage)."""
from __future__ import annotations

import errno
import signal
import sys
from typing import Callable

from minbert.core.errors import MinBertError

# what the file system says about a path the stage writes (a file where a folder should be, no permission)
PATH_ERRORS = (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG)


# import names that differ from the names pip installs
PIP_NAMES = {"sklearn": "scikit-learn", "yaml": "PyYAML", "PIL": "pillow", "huggingface_hub": "huggingface_hub"}


def requirement(module: str) -> str:
    """What to `pip install` for a missing module: the project's own requirement for it (name and
    version bounds, from its installed metadata, i.e. pyproject.toml), else the package's name."""
    import importlib.metadata
    import re

    name = PIP_NAMES.get(module, module)
    try:
        for req in importlib.metadata.requires("minbert-pipeline") or []:
            spec = req.split(";")[0].strip()
            if re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0].lower().replace("_", "-") == name.lower().replace("_", "-"):
                return spec
    except importlib.metadata.PackageNotFoundError:
        pass
    return name


def _terminate(signum, frame):
    raise SystemExit(128 + signum)   # unwinds like an exception: temporaries are removed, state kept


def run(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Call `main`; bad input (a MinBertError), a full disk, a missing package or an interruption
    print one line (no traceback) and exit with 2, 2, 2 or 128 + the signal. SIGTERM (what Slurm and the engines send)
    stops the stage as Ctrl-C does."""
    from minbert.pipeline.runinfo import UpToDate

    signal.signal(signal.SIGTERM, _terminate)
    try:
        main(argv)
    except UpToDate as e:
        print(e, file=sys.stderr)
        sys.exit(0)
    except MinBertError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if not top or top in ("minbert", "stages", "workflow"):
            raise                      # the project's own module: a bug, not an installation problem
        print(f"error: the Python package '{PIP_NAMES.get(top, top)}' is not installed (import {e.name} failed); "
              f"install it with `pip install '{requirement(top)}'` (or `pip install -e .`, which installs everything "
              f"the pipeline needs)", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            where = e.filename or "the disk"
            print(f"error: no space left on {where}; free some space (or point --results elsewhere) and run "
                  f"again", file=sys.stderr)
            sys.exit(2)
        if e.errno in PATH_ERRORS and e.filename:
            print(f"error: cannot write {e.filename}: {e.strerror}; check the path (--results, --out) and its "
                  f"permissions", file=sys.stderr)
            sys.exit(2)
        raise

"""How every command ends (the stages and `minbert`): one-line user errors and exit codes (arguments and jobs: minbert.pipeline.stage)."""
from __future__ import annotations

import errno
import importlib.metadata
import re
import signal
import sys
from typing import Callable

from minbert.core.errors import MinBertError, one_line

# what the file system says about a path the stage writes (a file where a folder should be, no permission)
PATH_ERRORS = (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG)


# import names that differ from the names pip installs
PIP_NAMES = {"sklearn": "scikit-learn", "yaml": "PyYAML", "PIL": "pillow", "huggingface_hub": "huggingface_hub"}


def requirement(module: str) -> str:
    """What to `pip install` for a missing module: the project's own requirement for it (name and
    version bounds, from its installed metadata, i.e. pyproject.toml), else the package's name."""
    name = PIP_NAMES.get(module, module)
    try:
        for req in importlib.metadata.requires("minbert-pipeline") or []:
            spec = req.split(";")[0].strip()
            if re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0].lower().replace("_", "-") == name.lower().replace("_", "-"):
                return spec
    except importlib.metadata.PackageNotFoundError:
        pass
    return name


PROJECT = ("minbert", "stages", "workflow")
_IMPORT_MACHINERY = ("importlib", "_frozen_importlib", "_frozen_importlib_external", "builtins")


def failing_package(e: ImportError) -> str | None:
    """The installed package an import failed in (the innermost module outside the project in the
    traceback: scipy, not scikit-learn that imports it), or the module the import named; None when
    the project's own code failed."""
    found, tb = None, e.__traceback__
    while tb is not None:
        top = str(tb.tb_frame.f_globals.get("__name__", "")).partition(".")[0]
        if top and top not in PROJECT and top not in _IMPORT_MACHINERY and top != "__main__":
            found = top
        tb = tb.tb_next
    top = (e.name or "").partition(".")[0]
    return found or (top if top and top not in PROJECT else None)


def _error(message: str) -> None:
    """Print the one bounded error line (minbert.core.errors.one_line) and exit with status 2."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    sys.exit(2)


def _broken_install(package: str, e: ImportError) -> None:
    name = PIP_NAMES.get(package, package)
    detail = (str(e).splitlines() or [type(e).__name__])[0]
    _error(f"the Python package '{name}' is installed but cannot be imported ({type(e).__name__}: {detail}); "
           f"a broken or mismatched installation: reinstall it with `pip install --force-reinstall "
           f"'{requirement(package)}'` (or `pip install -e .` in a fresh environment)")


def _terminate(signum, frame):
    raise SystemExit(128 + signum)   # unwinds like an exception: temporaries are removed, state kept


def run(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Call `main`; bad input (a MinBertError), a full disk or a file too large, a missing or broken
    package, or an interruption print one line (no traceback) and exit with 2, 2, 2 or 128 + the
    signal. SIGTERM (what Slurm and the engines send) stops the stage as Ctrl-C does."""
    from pydantic import ValidationError

    from minbert.pipeline.runinfo import UpToDate

    signal.signal(signal.SIGTERM, _terminate)
    try:
        main(argv)
    except UpToDate as e:
        print(e, file=sys.stderr)
        sys.exit(0)
    except MinBertError as e:
        _error(str(e))
    except ValidationError as e:   # a job file's settings this code no longer accepts (a user module gone, ...)
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        _error(f"the job's settings, key '{key}': {first['msg'].removeprefix('Value error, ')}; run the pipeline "
               f"again (it rewrites the job files from params.yaml) or fix params.yaml")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if not top or top in PROJECT:
            raise                      # the project's own module: a bug, not an installation problem
        if "." in (e.name or "") and sys.modules.get(top) is not None:   # torch there, torch._C missing
            _broken_install(top, e)
        _error(f"the Python package '{PIP_NAMES.get(top, top)}' is not installed (import {e.name} failed); install "
               f"it with `pip install '{requirement(top)}'` (or `pip install -e .`, which installs everything the "
               f"pipeline needs)")
    except ImportError as e:
        broken = failing_package(e)
        if broken is None:
            raise                      # raised by the project's own code: a bug
        _broken_install(broken, e)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            _error(f"no space left on {e.filename or 'the disk'}; free some space (or point --results elsewhere) and "
                   f"run again")
        if e.errno == errno.EFBIG:
            _error(f"{e.filename or 'a file the stage writes'}: file too large for its file system or for the file "
                   f"size limit (ulimit -f; FAT32 holds at most 4 GiB per file); write to another file system (point "
                   f"--results elsewhere) or raise the limit, and run again")
        if e.errno in PATH_ERRORS and e.filename:
            _error(f"cannot write {e.filename}: {e.strerror}; check the path (--results, --out) and its permissions")
        raise

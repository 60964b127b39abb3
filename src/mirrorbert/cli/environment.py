"""What a command needs of its process, checked before any work (a usable working folder, enough open files and
address space, a whole torchrun environment), and the streams it prints to: a character stdout's encoding cannot
hold is written as its JSON escape, and a closed pipe ends the command quietly (why: docs/design.md).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import resource
import sys
from typing import Iterator

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError

# The open files below which a command is refused, and the soft limit it raises itself to where it may.
OPEN_FILES_NEEDED = 64
OPEN_FILES_WANTED = 4096
# The address space (`ulimit -v`) below which a command is refused: torch's libraries alone map about this much.
ADDRESS_SPACE_NEEDED = 2 << 30
JSON_ESCAPE = "mirrorbert-json-escape"


def check_environment() -> None:
    """A UserError line when something about this process stops any command from working."""
    problem = _working_folder_problem() or _open_files_problem() or _memory_problem()
    if problem:
        raise UserError(problem)
    if any(os.environ.get(name) for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK")):  # else torch is not imported
        from mirrorbert.runtime.distributed import launch_environment

        launch_environment()  # a torchrun/accelerate environment that is half set


def _memory_problem() -> str | None:
    """An address-space limit (`ulimit -v`) below what loading torch alone maps."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft >= ADDRESS_SPACE_NEEDED:
        return None
    return (f"the address-space limit (ulimit -v) is {soft >> 20} MB, and loading torch alone maps about "
            f"{ADDRESS_SPACE_NEEDED >> 30} GB; raise it (ulimit -v unlimited) and run again")


def _working_folder_problem() -> str | None:
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        return ("the working folder no longer exists (it was removed or renamed while this shell was in it); "
                "cd to an existing folder and run again")
    except OSError as exc:
        return f"the working folder cannot be used ({os.strerror(exc.errno or 0).lower()}); cd to another folder"
    path_max = int(os.pathconf("/", "PC_PATH_MAX"))
    size = len(os.fsencode(cwd))
    if size >= path_max:
        return (f"the working folder's path is {size} bytes, longer than the system's limit for a path "
                f"(PATH_MAX, {path_max}): libraries cannot load from it; cd to a shorter path and run again")
    return None


def _open_files_problem() -> str | None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft != unlimited and soft < OPEN_FILES_WANTED and (hard == unlimited or hard > soft):
        wanted = OPEN_FILES_WANTED if hard == unlimited else min(hard, OPEN_FILES_WANTED)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    if soft != unlimited and soft < OPEN_FILES_NEEDED:
        return (f"the open-files limit (ulimit -n) is {soft}, and a command needs at least {OPEN_FILES_NEEDED} "
                f"(the model, the data, the outputs and the libraries each hold files open); raise it (ulimit -n "
                f"{OPEN_FILES_WANTED}) and run again")
    return None


def _json_escape(error: UnicodeError) -> tuple[str, int]:
    """A character an encoding cannot hold, as JSON writes it escaped (`\\u00e9`; a pair above U+FFFF)."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    return jsonio.dumps(error.object[error.start:error.end], ensure_ascii=True)[1:-1], error.end


codecs.register_error(JSON_ESCAPE, _json_escape)


@contextlib.contextmanager
def console_streams() -> Iterator[None]:
    """While inside, stdout writes what its encoding cannot hold as JSON escapes, and stderr as Python escapes
    (`\\xe9`, what Python's own stderr does), whatever streams the caller gave; a lone surrogate (a file name
    that is not UTF-8) is escaped the same way on any stdout."""
    changed = []
    for stream, errors in ((sys.stdout, JSON_ESCAPE), (sys.stderr, "backslashreplace")):
        before = getattr(stream, "errors", None)
        if before is not None and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):  # a closed or detached stream: left as it is
                stream.reconfigure(errors=errors)
                changed.append((stream, before))
    try:
        yield
    finally:
        for stream, before in changed:
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors=before)


def silence_stdout() -> None:
    """After a closed pipe: whatever is still buffered for stdout goes nowhere, so the interpreter's last
    flush does not fail again with a traceback."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


__all__ = ["OPEN_FILES_NEEDED", "OPEN_FILES_WANTED", "check_environment", "console_streams", "silence_stdout"]

"""A job's failure as one line of a manifest: the first line of the error, with what it does not say."""
from __future__ import annotations

# What a failure's text does not say, for errors whose cause we have measured.
HINTS = {
    "QNN_COMMON_ERROR_MEM_ALLOC": "the HTP could not fit a tensor of this graph; a shorter time axis (a smaller "
                                  "streaming chunk) may compile",
}


def short(e: BaseException) -> str:
    if isinstance(e, UpstreamFailed):
        return str(e)
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    line = (text[0] if text else type(e).__name__)[:400]
    hints = [h for key, h in HINTS.items() if key in str(e)]
    return line + "".join(f" ({h})" for h in hints)


class UpstreamFailed(Exception):
    """A job could not start: a job whose output it needs failed (its message is that failure)."""


class WorkerDied(RuntimeError):
    """A job's worker process ended without an answer (killed, or crashed in native code), on every
    attempt the executor gives it."""

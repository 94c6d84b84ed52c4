"""Stop cleanly on SIGINT, SIGTERM and SIGHUP; hold them back while DST is being published.

Python turns SIGINT into ``KeyboardInterrupt`` but lets SIGTERM (what ``kill``, ``timeout``,
systemd and CI runners send) and SIGHUP kill the process on the spot: no cleanup, a half-written
work folder left behind. While a command runs (:func:`stop_on_signals`), all three raise in the
main thread: SIGINT a ``KeyboardInterrupt``, SIGTERM/SIGHUP a :class:`Terminated` (a subclass),
so the one existing path handles them all: the library removes its partial output, the CLI
prints ``error: interrupted ...`` and exits 130. A second signal while that cleanup runs exits at
once (status 130) without finishing it; the work folder is hidden (``.DST.partial``) and never
looks like a finished DST, and the next run clears it.

:func:`deferred` holds the signals back around a critical section (the renames that publish
DST); one that arrives meanwhile is delivered when the section ends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading

# The signals that stop a run; SIGHUP: the terminal went away.
STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
EXIT_INTERRUPTED = 130


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived; handled exactly like Ctrl-C (cleanup, exit 130)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _Handler:
    """Raise once, then exit hard on a repeat (the user insists, or cleanup hangs)."""

    def __init__(self):
        self.fired = False

    def __call__(self, signum, frame):
        if self.fired:
            os.write(2, b"error: interrupted again; exiting now (the hidden work folder is cleared by the next run)\n")
            os._exit(EXIT_INTERRUPTED)
            return  # not reached (os._exit does not return); kept for patched test doubles
        self.fired = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def stop_on_signals(fn):
    """`fn` wrapped so that the stop signals raise (see the module docstring) while it runs.

    The previous handlers are restored afterwards. A signal ignored when the call starts (SIG_IGN,
    e.g. SIGINT in a background job, SIGHUP under nohup) stays ignored. Off the main thread
    (where Python cannot set handlers) `fn` runs unchanged.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _in_main_thread():
            return fn(*args, **kwargs)
        handler = _Handler()
        previous = {}
        for sig in STOP_SIGNALS:
            old = signal.getsignal(sig)
            if old is signal.SIG_IGN:
                continue
            previous[sig] = old
            signal.signal(sig, handler)
        try:
            return fn(*args, **kwargs)
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old if old is not None else signal.SIG_DFL)

    return wrapper


def exit_quietly_on_repeat() -> None:
    """After an interrupt was handled and the process is exiting: a further stop signal exits at
    once (status 130) instead of raising inside the interpreter's atexit hooks (thread joins of
    torch / Ray / concurrent.futures), which prints a traceback. Main thread only."""
    if not _in_main_thread():
        return

    def _exit(signum, frame):
        os._exit(EXIT_INTERRUPTED)

    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _exit)


@contextlib.contextmanager
def deferred():
    """Hold back the stop signals for the duration of the block; deliver them when it ends.

    Works whether or not :func:`stop_on_signals` is active: the current handlers are swapped for
    a recorder, restored afterwards, and each recorded signal is raised again, so it gets exactly
    the treatment it would have had (our handler, Python's KeyboardInterrupt, or the default
    action). Python runs signal handlers in the main thread only, so this is thread-safe where
    a signal mask (per thread, inherited by torch's worker threads) would not be. Off the main
    thread the block runs unprotected.
    """
    if not _in_main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    for sig in STOP_SIGNALS:
        old = signal.getsignal(sig)
        if old is signal.SIG_IGN:
            continue
        previous[sig] = old
        signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)

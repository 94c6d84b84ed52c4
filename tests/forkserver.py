"""A `quantize` command that starts in milliseconds: one server imports torch and transformers once,
and every command forks from it.

Why: docs/ci.md's shell script runs `quantize` four times; as separate processes each pays ~4 s of
CPU for torch and ~7 s for transformers, which for every algorithm on two models is minutes of a
2-core machine's time. The script still runs as written (bash, its own lines): only the `quantize`
on its PATH is this module's client (:func:`install`), which hands its argv, cwd, environment and
stdin/stdout/stderr (the file descriptors themselves, SCM_RIGHTS) to the server; the server forks,
the child runs ``quantize_cli.cli.main`` exactly as the console script does (its atexit handlers
included) and the server returns its exit status (a signal N as 128 + N, as a shell reports it).

The server imports the modules only: it runs no torch op and starts no thread, so forking it is
safe. Run it with the environment the commands should see at import (``HF_ENDPOINT``, ``HF_HOME``:
huggingface_hub reads them once); each child also gets the client's environment and cwd.
One command at a time (a script's commands run one after another).

    server = ForkServer(tmp, env).start()  # returns once the imports are done
    server.install(bindir)                 # bindir/quantize: the client
    ...
    server.stop()
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOAD = ("torch", "transformers", "quantize_cli.cli", "quantize_cli.api", "quantize_cli.convert", "quantize_cli.eval",
           "quantize_cli.calibration.forward")
MODELS = ("LlamaForCausalLM", "BertModel", "AutoModel", "AutoModelForCausalLM")  # transformers loads these lazily

CLIENT = """\
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["QUANTIZE_FORKSERVER"])
msg = json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
socket.send_fds(s, [len(msg).to_bytes(4, "big") + msg], [0, 1, 2])
code = s.recv(4)
sys.exit(int.from_bytes(code, "big") if len(code) == 4 else 1)
"""


class ForkServer:
    def __init__(self, folder: str, env: dict):
        self.socket = os.path.join(folder, "quantize.sock")
        self.env = {**env, "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""), "QUANTIZE_FORKSERVER": self.socket}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> "ForkServer":
        if os.path.exists(self.socket):  # an earlier server's: the wait below must see this one's
            os.unlink(self.socket)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver", self.socket], cwd=ROOT, env=self.env)
        end = time.monotonic() + timeout
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError("the fork server did not start")
            time.sleep(0.05)
        return self

    def install(self, bindir: str) -> str:
        """Write the client as `bindir/quantize`; returns bindir (put it first on PATH, with
        QUANTIZE_FORKSERVER from :attr:`env`)."""
        os.makedirs(bindir, exist_ok=True)
        path = os.path.join(bindir, "quantize")
        with open(path, "w") as f:
            f.write(f"#!{sys.executable} -S\n{CLIENT}")  # -S: no site-packages scan, ~20 ms a start
        os.chmod(path, 0o755)
        return bindir

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if os.path.exists(self.socket):
            os.unlink(self.socket)


def _recv(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    n = int.from_bytes(data[:4], "big")
    body = data[4:]
    while len(body) < n:  # a stream socket may split a large environment
        body += conn.recv(n - len(body))
    return json.loads(body), fds


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the client's process and run the CLI; never returns."""
    import atexit

    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["quantize", *request["argv"]]
        from quantize_cli.cli import main

        try:
            main(args=request["argv"], prog_name="quantize")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        atexit._run_exitfuncs()
    except BaseException:  # a crash in the CLI is the test's finding: show it as a process would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import transformers

    for name in MODELS:
        getattr(transformers, name)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path + ".tmp")
    listener.listen(4)
    os.rename(path + ".tmp", path)  # the socket appears once it accepts: start() waits for it
    while True:
        conn, _ = listener.accept()
        with conn:
            request, fds = _recv(conn)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                _child(request, fds)
            for fd in fds:
                os.close(fd)
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            conn.sendall((status if status >= 0 else 128 - status).to_bytes(4, "big"))


if __name__ == "__main__":
    serve(sys.argv[1])

"""Provides the engine server's rendezvous for clients, on the standard library alone: where the socket lives, who
holds it, whether a server can stand in for the engine asked for, and the first request sent before anything
heavy is imported.

`send_say` is what makes `say` through a warm server quick: the client connects, says hello and sends its request
with blocking calls, then imports its audio stack and checks its input while the server already generates
(`voiceapp.server.client.RemoteSynthesizer.adopt` takes the request over from there).
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from engine.config import MODEL_ENV, SynthesisRequest
from engine.errors import VoiceError
from engine.protocol import (HEADER, KIND_JSON, PROTOCOL_VERSION, ProtocolError, encode_message, parse_header,
                             parse_payload, project_version)

SOCKET_ENV = "VOICEAPP_SOCKET"
SOCKET_NAME = "engine.sock"
NO_SERVER_ENV = "VOICEAPP_NO_SERVER"
"""Set to anything but "" or "0": never start nor use a server (as --no-server)."""
CONNECT_TIMEOUT_S = 2.0
"""Connect + hello; a live server answers in well under a millisecond."""
LOG_PREFIX = "voicectl serve: "
"""Every line the server itself logs starts so (its stderr also carries what libraries print)."""


def server_disabled(no_server_flag: bool, env: Mapping[str, str] | None = None) -> bool:
    """--no-server, or VOICEAPP_NO_SERVER set to anything but "" or "0"."""
    env = os.environ if env is None else env
    return no_server_flag or env.get(NO_SERVER_ENV, "") not in ("", "0")


# ---- where the socket is ----------------------------------------------------------------------------------

def default_socket_path(env: Mapping[str, str] | None = None) -> Path:
    """$VOICEAPP_SOCKET, else $XDG_RUNTIME_DIR/voiceapp/engine.sock, else /tmp/voiceapp-$UID/engine.sock."""
    env = os.environ if env is None else env
    if env.get(SOCKET_ENV):
        return Path(env[SOCKET_ENV]).expanduser()
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "voiceapp" / SOCKET_NAME
    return Path("/tmp") / f"voiceapp-{os.getuid()}" / SOCKET_NAME


def socket_path(arg: str | None) -> Path:
    return Path(arg).expanduser() if arg else default_socket_path()


def is_default_location(path: Path) -> bool:
    """`path` is where the socket lives when $VOICEAPP_SOCKET is not set: its directory must be ours and private."""
    return path == default_socket_path({k: v for k, v in os.environ.items() if k != SOCKET_ENV})


def lock_path(path: Path) -> Path:
    """The lock file a server holds beside its socket (it holds the server's pid)."""
    return path.with_name(path.name + ".lock")


def lock_holder(path: Path) -> int | None:
    """The pid in the lock file of the socket at `path` while that process holds the lock: the server listening
    there, or one still loading its engine. None when there is no lock file, no pid in it yet, or no process holds
    it. A live process of that pid is not enough: the pid of a killed server is soon another process's."""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        pid = int(os.read(fd, 32).decode(errors="replace").strip())
        return pid if holds_flock(fd, pid) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def holds_flock(fd: int, pid: int) -> bool:
    """Whether process `pid` holds a flock on the file open at `fd`. Linux lists the locks it holds in
    /proc/locks, which asks without taking one; elsewhere a shared-lock probe says whether anyone holds it."""
    st = os.fstat(fd)
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()  # "1: FLOCK ADVISORY WRITE 6279 fe:00:2147162 0 EOF"
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4] == str(pid) and \
                        fields[5].rsplit(":", 1)[-1] == str(st.st_ino):
                    return True
        return False
    except OSError:
        pass
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def serve_pids(socket_file: str | Path) -> list[int]:
    """Live `voiceapp.cli serve` processes whose command line names `socket_file` (background servers do, and so
    do servers still loading, which have no socket yet)."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if "voiceapp.cli" in argv and "serve" in argv and str(socket_file) in argv:
                pids.append(int(entry.name))
    return pids


def peer_credentials(sock: Any) -> tuple[int, int] | None:
    """(pid, uid) of the process at the other end of a Unix socket (Linux SO_PEERCRED; None where unsupported)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


class ServerNotAnswering(VoiceError):
    """Something holds the server's socket but has not said hello in time (a server stopped with SIGSTOP or Ctrl-Z,
    or stuck): a server that is well answers within milliseconds."""


def not_answering(path: Path, timeout_s: float) -> str:
    """ServerNotAnswering's message: the server named by the pid holding its lock where there is one."""
    pid = lock_holder(path)
    who = f"the voicectl server (pid {pid})" if pid is not None else f"the voicectl server at {path}"
    return f"{who} has not answered in {timeout_s:g} s (stopped or stuck?)"


# ---- can it stand in ---------------------------------------------------------------------------------------

def server_mismatch(info: dict[str, Any], backend: str, model: str | None) -> str | None:
    """Why the server cannot stand in for an engine of this project version, backend and model; None if it can.

    The checkpoint is compared by its hash (`engine.model.checkpoint_hash`), never by its path: a checkpoint
    replaced in place, or a path that names another folder from the server's directory than from ours, is another
    checkpoint. The fake engine stands in only for a client asking for it, and only it does. Devices and threads are
    the server's business and are not compared."""
    if info.get("version") != project_version():
        return f"is voiceapp {info.get('version') or '(an older version)'}, not {project_version()} like this voicectl"
    served_backend = info.get("backend")
    if backend == "auto" and served_backend == "fake":
        return "is the fake engine (it stands in only for --backend fake)"
    if backend != "auto" and backend != served_backend:
        return f"uses the {served_backend} backend, not {backend}"
    if backend == "fake":  # the fake engine reads no checkpoint: only a server of none can stand in for one asked for
        named = model or os.environ.get(MODEL_ENV)
        return f"serves no model, not {named}" if named and info.get("model") is None else None
    try:
        wanted = wanted_checkpoint(model, os.environ.get(MODEL_ENV) or None)
    except OSError as err:  # a file of it cannot be read: in-process says what is wrong with it
        return f"cannot be compared with the checkpoint asked for ({err.strerror or err})"
    if wanted is None:  # nothing asked for and no default checkpoint here: the server's is the only one
        return None
    served = info.get("model") if isinstance(info.get("model"), dict) else None
    if served is None or served.get("hash") != wanted[1]:
        what = f"{served.get('path')} (checkpoint {served.get('hash')})" if served else "no model"
        return f"serves {what}, not {wanted[0]} (checkpoint {wanted[1]})"
    return None


@functools.lru_cache(maxsize=4)
def wanted_checkpoint(model: str | None, env_model: str | None) -> tuple[str, str] | None:
    """(absolute folder, checkpoint hash) of the checkpoint this process would load for --model `model` (else
    $VOICEAPP_MODEL, `env_model`, which keys the cache, else the default download); None when neither is given and
    no default is there. Raises ModelNotFound for an explicit folder that is not there.

    The hash is `engine.model.checkpoint_hash` of the folder, which is what every family's `read` reports as its
    `checkpoint_hash` (a test keeps them equal), taken directly: asking the family would import the text rules and
    parse the tokenizer on the lean road. Its file digests are cached, so after the first time this only stats the
    checkpoint's files; engine.model imports no numpy."""
    from engine.errors import ModelNotFound
    from engine.model import checkpoint_hash, resolve_model_dir

    try:
        root = resolve_model_dir(model).resolve()
    except ModelNotFound:
        if model or env_model:
            raise
        return None
    return str(root), checkpoint_hash(root)


def say_message(req: SynthesisRequest, text: str, streamed: bool) -> dict[str, Any]:
    """The `say` request for `req` with its first piece of `text` (more follows when `streamed`)."""
    o = req.options
    return {"type": "say", "text": text, "voice": req.voice, "seed": o.seed, "stream": streamed,
            "options": {"temperature": o.temperature, "top_k": o.top_k, "top_p": o.top_p,
                        "max_tokens": o.max_tokens}}


# ---- the first request, before the heavy imports -------------------------------------------------------------

@dataclass
class SentSay:
    """A connection on which a whole `say` request (text included) has been sent and nothing read back yet."""

    sock: socket.socket
    info: dict[str, Any]
    """The server's hello: pid, project version, model, backend, sample_rate."""
    sent_perf: float
    """time.perf_counter() when the request went out: the request's start for its TTFA."""
    path: Path | None = None
    """The server's socket, where `still_answers` asks it again while its first reply is late."""

    def cancel(self) -> None:
        """Give the request up (the caller's own checks failed): the server aborts a request whose client left."""
        with contextlib.suppress(OSError):
            self.sock.close()


def send_say(path: Path, backend: str, model: str | None, req: SynthesisRequest) -> SentSay | None:
    """Connect, exchange hellos and send `req` whole, blocking; None when no server answers at `path` or the one
    that answers cannot stand in (the caller then takes the usual road, which starts a server or says why not).
    ServerNotAnswering when one holds the socket but does not say hello within CONNECT_TIMEOUT_S."""
    if not path.exists():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(str(path))
            info = _hello(sock)
        except TimeoutError:  # something holds the socket but neither accepts nor answers in time
            raise ServerNotAnswering(not_answering(path, CONNECT_TIMEOUT_S)) from None
        if info is None or server_mismatch(info, backend, model) is not None:
            sock.close()
            return None
    except BaseException as err:
        sock.close()
        if isinstance(err, (OSError, ProtocolError, ValueError)):
            return None
        raise
    try:
        sent = time.perf_counter()
        sock.sendall(encode_message(say_message(req, req.text, streamed=False)))
        return SentSay(sock, info, sent, path)
    except (OSError, ProtocolError, ValueError):
        sock.close()
        return None


FIRST_REPLY_S = 2.0
"""A request whose first reply has not come within this has its server asked for a hello on a new connection:
a server that answers is busy and is waited on; one that does not is given up on (stopped or stuck)."""


def still_answers(path: Path) -> bool:
    """Whether the server at `path` says hello within CONNECT_TIMEOUT_S. True also where nothing listens any more:
    a server that went away ends the request's own connection, which says so."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(str(path))
        _hello(sock)
        return True
    except TimeoutError:
        return False
    except (OSError, ProtocolError, ValueError):
        return True
    finally:
        sock.close()


def _hello(sock: socket.socket) -> dict[str, Any] | None:
    """The server's hello reply; None from another user's server or a peer that does not answer with one."""
    creds = peer_credentials(sock)
    if creds is not None and creds[1] != os.getuid():
        return None
    sock.sendall(encode_message({"type": "hello", "v": PROTOCOL_VERSION}))
    kind, length = parse_header(_read_exactly(sock, HEADER.size))
    reply = parse_payload(kind, _read_exactly(sock, length)) if kind == KIND_JSON else None
    return reply if isinstance(reply, dict) and reply.get("type") == "hello" else None


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("the server closed the connection")
        data += part
    return data

"""Provides stdin as an async stream of text pieces, delivered as soon as bytes arrive (for `say -`)."""
from __future__ import annotations

import asyncio
import codecs
import os
import threading
from typing import AsyncIterator

from engine.errors import InputError

READ_BYTES = 65536


async def stdin_pieces(fd: int = 0) -> AsyncIterator[str]:
    """Yield decoded text as it arrives on `fd` until EOF. A daemon thread does the blocking reads, so a
    Ctrl-C never hangs on a silent pipe. Invalid UTF-8 or binary bytes end the stream with an InputError."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None | BaseException] = asyncio.Queue()

    def reader() -> None:
        try:
            while True:
                data = os.read(fd, READ_BYTES)
                loop.call_soon_threadsafe(queue.put_nowait, data or None)
                if not data:
                    return
        except BaseException as err:  # handed to the event loop
            loop.call_soon_threadsafe(queue.put_nowait, err)

    threading.Thread(target=reader, name="stdin-reader", daemon=True).start()
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    while True:
        data = await queue.get()
        if isinstance(data, BaseException):
            raise InputError(f"cannot read stdin: {data}")
        if data is None:
            tail = _decode(decoder, b"", offset, final=True)
            if tail:
                yield tail
            return
        if b"\x00" in data:
            raise InputError("stdin looks like binary data, not text")
        text = _decode(decoder, data, offset, final=False)
        offset += len(data)
        if text:
            yield text


def _decode(decoder, data: bytes, offset: int, final: bool) -> str:
    try:
        return decoder.decode(data, final)
    except UnicodeDecodeError as err:
        raise InputError(f"stdin is not valid UTF-8 text (near byte {offset + err.start})") from None

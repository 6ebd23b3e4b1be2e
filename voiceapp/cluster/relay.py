"""Provides streamed text's way from the ingress of `voicectl serve --ray` to the replica its request runs on
(`voicectl say -`, Wyoming's streamed text): `TextRelay`, a Ray actor the ingress starts (and owns: it ends with
the ingress), holds each streamed request's pieces under the request's key. The ingress puts them as they arrive
(`pump`); the replica takes them as its engine asks (`relayed_text`) and splits them into sentences as the plain
server's engine does (the splitter gives the same sentences however the text is cut), so each sentence is spoken
once it is complete, before the text's end.

A request's text cannot ride its own streaming call: a Serve call's arguments go once, at its start. The relay is
a plain asyncio class, made a Ray actor by voiceapp.cluster.serve; Ray is imported here only where its errors
are caught.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterable, AsyncIterator

from engine.errors import GenerationError, InputError

PENDING_CHARS = 1 << 16
"""Characters a request's relay holds before `put` waits for the replica to take them: a client that pipes a book
into `say -` is paced by its replica's speech, as the plain server paces it, and the relay's memory stays small."""
DROPPED_KEPT = 4096
"""Dropped keys the relay remembers: a put or take that comes after its key's drop (the two sides' calls race:
a text stream that fails at once is dropped before the replica's first take) returns at once rather than wait
for good."""
OPEN, END, GONE = "open", "end", "gone"
"""What `take` says of a request's text besides its pieces: more may come; that was all; dropped (the request
ended at the other side, or its text stream failed)."""


@dataclass(frozen=True)
class TextFeed:
    """Where a streamed request's replica takes its text: the ingress's relay (a Ray actor handle) and the key."""

    relay: Any
    key: str


class _Pending:
    """One request's pieces not yet taken."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.chars = 0
        self.state = OPEN
        self._changed = asyncio.Event()

    def wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        await self._changed.wait()


class TextRelay:
    """The streamed requests' text on its way to their replicas, by key (the module's docstring). Either side may
    come first; the key goes once its end is taken or it is dropped."""

    def __init__(self, limit: int = PENDING_CHARS) -> None:
        self.limit = limit
        self._pending: dict[str, _Pending] = {}
        self._dropped: dict[str, None] = {}
        """The latest DROPPED_KEPT dropped keys, oldest first."""

    def _of(self, key: str) -> _Pending:
        """`key`'s pending text: new where none is, and GONE (held nowhere) where the key was dropped."""
        if key in self._dropped:
            gone = _Pending()
            gone.state = GONE
            return gone
        return self._pending.setdefault(key, _Pending())

    async def put(self, key: str, piece: str | None) -> bool:
        """Add a piece (None: the end of the text), waiting while `limit` characters wait; False when the key
        was dropped (the replica let go of the request)."""
        pending = self._of(key)
        while pending.chars >= self.limit and pending.state == OPEN:
            await pending.changed()
        if pending.state != OPEN:
            return False
        if piece is None:
            pending.state = END
        else:
            pending.pieces.append(piece)
            pending.chars += len(piece)
        pending.wake()
        return True

    async def take(self, key: str) -> tuple[str, str]:
        """All the text waiting under `key`, once there is some or the state is no longer OPEN: (text, state)."""
        pending = self._of(key)
        while not pending.pieces and pending.state == OPEN:
            await pending.changed()
        text, state = "".join(pending.pieces), pending.state
        pending.pieces, pending.chars = [], 0
        if state != OPEN:
            self._pending.pop(key, None)
        pending.wake()  # a put waiting for room
        return text, state

    def drop(self, key: str) -> None:
        """Forget `key`: a put or take waiting on it, or coming later, returns (GONE)."""
        self._dropped[key] = None
        if len(self._dropped) > DROPPED_KEPT:
            del self._dropped[next(iter(self._dropped))]
        pending = self._pending.pop(key, None)
        if pending is not None:
            pending.state = GONE
            pending.wake()

    def keys(self) -> int:
        """Requests the relay holds text for (status, tests)."""
        return len(self._pending)


async def pump(feed: TextFeed, text_stream: AsyncIterable[str]) -> None:
    """The ingress's side: put `text_stream`'s pieces under the feed's key as they come, then its end. A stream
    that fails drops the key (the replica's request ends) and raises; a relay that is gone is GenerationError."""
    import ray

    try:
        async for piece in text_stream:
            if piece and not await feed.relay.put.remote(feed.key, piece):
                return  # the replica let go of the request
        await feed.relay.put.remote(feed.key, None)
    except ray.exceptions.RayError as err:
        raise GenerationError(f"the streamed text could not reach the engine replica ({type(err).__name__}: "
                              f"the ingress's text relay stopped)") from None
    except BaseException:
        feed.relay.drop.remote(feed.key)
        raise


async def relayed_text(feed: TextFeed) -> AsyncIterator[str]:
    """The replica's side: the request's text as the ingress puts it, until its end. Dropped by the ingress
    first: InputError (the text stream failed; a cancelled request is cancelled here too). The relay gone:
    GenerationError."""
    import ray

    try:
        while True:
            try:
                text, state = await feed.relay.take.remote(feed.key)
            except ray.exceptions.RayError as err:
                raise GenerationError(f"the streamed text stopped reaching this replica ({type(err).__name__}: "
                                      f"the ingress's text relay stopped)") from None
            if text:
                yield text
            if state == END:
                return
            if state == GONE:
                raise InputError("the request's streamed text ended before its end (its client went away)")
    finally:
        feed.relay.drop.remote(feed.key)  # a take still waiting there (this call was cancelled) returns

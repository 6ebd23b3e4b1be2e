"""An engine that is full (engine.errors.EngineBusy, as a Ray replica at its capacity says) gets the HTTP client a
429 with Retry-After, counted as busy, before any audio; the server goes on."""
from __future__ import annotations

import asyncio
import json

from engine.errors import EngineBusy
from tests.pure.test_engine_api import Echo


class Full(Echo):
    async def synthesize(self, req, text_stream=None):
        raise EngineBusy("every engine replica carries as many streams as it takes", retry_after_s=3)
        yield  # an async generator, as an engine's synthesize is


def test_a_full_engine_is_a_429_with_retry_after(tmp_path):
    from voiceapp.http.api import HttpApi, bind_listener
    from voiceapp.server.engine_server import EngineServer, LiveRequests

    async def main():
        server = EngineServer(Full(), tmp_path / "s.sock", LiveRequests(lambda line: None))
        api = HttpApi(server, bind_listener("127.0.0.1", 0), log=lambda line: None)
        await api.start()
        host, port = api.sock.getsockname()[:2]
        reader, writer = await asyncio.open_connection(host, port)
        body = json.dumps({"model": "tts-1", "voice": "ava", "input": "Hello.", "response_format": "pcm"}).encode()
        writer.write(f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        response = await reader.read()
        writer.close()
        status = api.status()
        await api.close()
        await server.close()
        return response.decode(), status

    response, status = asyncio.run(main())
    head, _, payload = response.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 429") and "retry-after: 3" in head.lower()
    assert json.loads(payload)["error"]["message"] == "every engine replica carries as many streams as it takes"
    assert status["busy"] == 1 and status["failed"] == 0

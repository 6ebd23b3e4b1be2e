"""Device check: a server on backend auto answers, then tunes in the background while requests keep coming; prints
each tuning step's state after WAIT seconds (the decoder's step comes first and takes seconds).

  python lab/gpu_tuning_check.py MODEL_DIR [WAIT_S]
"""
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time


async def main(model: str, wait_s: float) -> None:
    from engine.config import SynthesisRequest
    from voiceapp.server.client import RemoteSynthesizer, server_status

    work = tempfile.mkdtemp(prefix="vs-")
    sock = os.path.join(work, "engine.sock")
    env = {**os.environ, "VOICEAPP_SOCKET": sock}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "voiceapp.cli", "serve", "--model", model], env=env,
                            stderr=open(os.path.join(work, "serve.log"), "w"))
    while await server_status(__import__("pathlib").Path(sock)) is None:
        await asyncio.sleep(0.05)
    print(f"listening after {time.perf_counter() - t0:.1f} s", flush=True)
    served = failed = 0
    end = time.perf_counter() + wait_s
    while time.perf_counter() < end:
        remote = await RemoteSynthesizer.connect(__import__("pathlib").Path(sock))
        try:
            audio = await remote.render(SynthesisRequest("Testing while the server tunes itself."))
            served, failed = served + (len(audio) > 0), failed + (len(audio) == 0)
        except Exception as err:  # noqa: BLE001 - counted and shown
            failed += 1
            print("request failed:", err, flush=True)
        finally:
            await remote.close()
    status = await server_status(__import__("pathlib").Path(sock))
    print(json.dumps({"served": served, "failed": failed, "tuning": status.get("tuning")}), flush=True)
    proc.terminate()
    proc.wait(30)
    print(open(os.path.join(work, "serve.log")).read()[-1500:])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 25.0))

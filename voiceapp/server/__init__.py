"""Provides the engine server (`voicectl serve`) and its clients: the Unix-socket server, the client, the
rendezvous both share (standard library only) and the autostart that starts a server in the background. Kept
empty: the lean `say` road imports `voiceapp.server.rendezvous` without numpy or asyncio."""

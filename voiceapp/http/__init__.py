"""Provides the OpenAI-compatible speech API that `voicectl serve --http` adds: the pure request rules, the
streamed encoders and the HTTP front end over the engine server."""

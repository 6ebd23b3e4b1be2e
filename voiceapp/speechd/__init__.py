"""Provides the speech-dispatcher integration: the files `voicectl speechd install` writes, and the native
output module process (`voicectl speechd module`) with its SSML reading."""

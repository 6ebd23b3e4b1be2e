"""Provides Home Assistant's Wyoming protocol front end (`voicectl serve --wyoming`)."""

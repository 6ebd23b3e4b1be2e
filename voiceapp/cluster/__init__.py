"""Provides engines on a Ray cluster: replicas behind our servers (`serve`, `replica`) and a book's sentences on
Ray Data (`export`)."""

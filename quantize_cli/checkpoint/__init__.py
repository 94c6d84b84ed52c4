"""Checkpoint I/O: source resolution, header parsing, the streaming writer, metadata builders."""

"""Streams, events and copies (facade over paddle_rt._core.stream / event / memcpy)."""
from paddle_rt._core.stream import Stream, stream, current_stream, default_stream
from paddle_rt._core.event import Event
from paddle_rt._core.memcpy import memcpy, memcpy_async, memset, memset_async, MEMCPY_KINDS

__all__ = ["Stream", "stream", "current_stream", "default_stream", "Event",
           "memcpy", "memcpy_async", "memset", "memset_async", "MEMCPY_KINDS"]

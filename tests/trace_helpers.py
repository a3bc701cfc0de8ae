"""Writing allocator logs and JSON traces for the tests of the trace tools (replay, plot, corpus)."""
import gzip


def write_text(path, text, gz=False):
    """Write text to path (a pathlib.Path), gzip-compressed when gz; returns the path as a string."""
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


def write_trace(path, events, gz=False):
    """An allocator log in Paddle's CSV layout, one line per (action, pointer, size) of events."""
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i, (act, ptr, size) in enumerate(events):
        lines.append(f"0,{i * 0.001:.6f},{act},0x{ptr:x},{size},0")
    return write_text(path, "\n".join(lines) + "\n", gz)

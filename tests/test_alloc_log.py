"""paddle_rt._core.alloc_log: building, validating and writing RMM-format allocation logs."""
import gzip

import pytest

from paddle_rt._core import alloc_log
from paddle_rt._core.alloc_log import AllocationLogError


def ev(t, is_alloc, ptr, size, thread=0, stream=0):
    return (thread, t, is_alloc, ptr, size, stream)


def test_from_recording_drops_frees_of_earlier_memory_and_sorts_by_time():
    events = [ev(3, False, 0x10, 8), ev(1, True, 0x10, 8), ev(2, False, 0x99, 4), ev(4, True, 0x10, 16)]
    out = alloc_log.from_recording(events, "t")
    assert [(e[1], e[2], e[3]) for e in out] == [(1, True, 0x10), (3, False, 0x10), (4, True, 0x10)]
    assert alloc_log.validate(out, "t") == (2, 16)


@pytest.mark.parametrize("events, rule", [
    ([ev(1, True, 0x10, 8), ev(2, True, 0x10, 8)], "allocated again while live"),
    ([ev(1, True, 0x10, 8), ev(2, False, 0x10, 8), ev(3, False, 0x10, 8)], "freed twice"),
    ([ev(1, True, 0x10, 8), ev(2, False, 0x10, 9)], "allocated with 8"),
])
def test_from_recording_refuses_broken_logs(events, rule):
    with pytest.raises(AllocationLogError, match=rule):
        alloc_log.from_recording(events, "capture")


@pytest.mark.parametrize("events, rule", [
    ([ev(2, True, 0x10, 8), ev(1, False, 0x10, 8)], "backwards"),
    ([ev(1, False, 0x10, 8)], "not a live allocation"),
    ([ev(1, True, 0x10, -1)], "not a byte count"),
])
def test_write_validates_first_and_writes_nothing(tmp_path, events, rule):
    path = tmp_path / "t.csv.gz"
    with pytest.raises(AllocationLogError, match=rule):
        alloc_log.write(path, events, "w")
    assert list(tmp_path.iterdir()) == []


def test_write_refuses_an_empty_log(tmp_path):
    with pytest.raises(AllocationLogError, match="no allocation"):
        alloc_log.write(tmp_path / "t.csv", [], "w")
    assert list(tmp_path.iterdir()) == []


def test_write_format(tmp_path):
    events = [ev(1_000_000_000, True, 0xab, 8, thread=77, stream=5), ev(1_500_000_000, True, 0xcd, 4, stream=9),
              ev(2_000_000_000, False, 0xab, 8, thread=77, stream=5)]
    assert alloc_log.write(tmp_path / "t.csv.gz", events, "w") == (2, 12)
    text = gzip.open(tmp_path / "t.csv.gz", "rt").read()
    lines = text.splitlines()
    assert lines[0] == "Thread,Time,Action,Pointer,Size,Stream"
    # threads and streams numbered in order of appearance, times in seconds from the first event
    assert lines[1:] == ["0,0.000000000,allocate,0xab,8,0", "1,0.500000000,allocate,0xcd,4,1",
                         "0,1.000000000,free,0xab,8,0"]

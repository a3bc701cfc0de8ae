"""``python -m paddle_rt demo``: a walk through paddle_rt on the bundled rt_cpu plugin, printing what it does."""
import argparse

import paddle_rt


def step(title):
    print(f"\n== {title}")


def demo_plugins():
    step("plugins")
    for p in paddle_rt.list_plugins():
        print(f"loaded {p.device_type!r} ({p.sub_device_type}), ABI {'.'.join(map(str, p.version))}, "
              f"{len(p.capabilities)} hooks implemented, {len(p.missing)} missing")
    rt = paddle_rt.device("rt_cpu:0").plugin
    print(f"rt_cpu at {rt.path}")


def demo_devices():
    step("devices")
    for d in paddle_rt.devices("rt_cpu"):
        free, total = d.memory_info()
        props = d.properties
        print(f"{d}: {free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB, min chunk {props.get('min_chunk_size')}, "
              f"extra padding {props.get('extra_padding_size')}, bf16 {props.get('bfloat16_supported')}")
    d1 = paddle_rt.set_device("rt_cpu:1")
    print(f"set_device({d1}) -> current device of this thread: {paddle_rt.get_device()}")
    paddle_rt.set_device("rt_cpu:0")
    paddle_rt.synchronize()
    print("synchronize() returned: the device is idle")


def demo_memory():
    step("memory: the caching allocator")
    import numpy as np

    d = paddle_rt.device("rt_cpu:0")
    hints = d.properties
    a = paddle_rt.malloc(1000, d)
    print(f"malloc(1000) -> Allocation at {a.ptr:#x}, {a.size} bytes requested; with min chunk "
          f"{hints.get('min_chunk_size')} and padding {hints.get('extra_padding_size')} the block holds "
          f"{paddle_rt.memory_allocated(d)} bytes")
    view = np.asarray(a)
    view[:] = 7
    print(f"numpy.asarray(a) is a zero-copy uint8 view: sum after filling with 7 = {int(view.sum())}")
    del view
    a.free()
    b = paddle_rt.malloc(1000, d)
    print(f"free + malloc of the same size reuses the cached block: same address = {b.ptr == a.ptr}")
    b.free()
    stats = paddle_rt.memory_stats(d)
    print(f"memory_stats: allocated {stats['allocated_bytes.all.current']} B, reserved "
          f"{stats['reserved_bytes.all.current']} B in {stats['segment.all.current']} segment(s), "
          f"{stats['num_device_alloc']} device allocation(s)")
    free_before = d.memory_info()[0]
    released = paddle_rt.empty_cache(d)
    print(f"empty_cache() gave {released} bytes back; "
          f"device free memory {free_before} -> {d.memory_info()[0]}")
    try:
        paddle_rt.malloc(d.memory_info()[1] * 2, d)
    except paddle_rt.OutOfMemoryError as exc:
        print(f"asking for twice the capacity raises OutOfMemoryError:\n  {str(exc).splitlines()[0]}")


SECTIONS = [demo_plugins, demo_devices, demo_memory]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m paddle_rt demo", description=__doc__)
    ap.parse_args(argv)
    print(f"paddle_rt {paddle_rt.__version__} demo on the bundled rt_cpu plugin")
    for section in SECTIONS:
        section()
    print("\ndemo finished")
    return 0

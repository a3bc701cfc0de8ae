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


SECTIONS = [demo_plugins, demo_devices]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m paddle_rt demo", description=__doc__)
    ap.parse_args(argv)
    print(f"paddle_rt {paddle_rt.__version__} demo on the bundled rt_cpu plugin")
    for section in SECTIONS:
        section()
    print("\ndemo finished")
    return 0

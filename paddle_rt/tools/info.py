"""``python -m paddle_rt info``: what is loaded and what each plugin can do."""
import json

import paddle_rt
from paddle_rt.tools.cli import command_parser


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024.0


def collect():
    out = {"plugins": [], "device_types": paddle_rt.device_types()}
    for p in paddle_rt.list_plugins():
        entry = {"device_type": p.device_type, "sub_device_type": p.sub_device_type,
                 "version": ".".join(map(str, p.version)), "path": p.path, "bundled": p.bundled,
                 "implemented": list(p.capabilities), "missing": list(p.missing), "devices": []}
        try:
            for d in paddle_rt.devices(p.device_type):
                props = d.properties
                free, total = d.memory_info()
                entry["devices"].append({"device": str(d), "properties": props, "free": free, "total": total})
        except paddle_rt.PaddleRTError as exc:
            entry["error"] = str(exc)
        out["plugins"].append(entry)
    try:
        out["current_device"] = str(paddle_rt.get_device())
    except paddle_rt.PaddleRTError as exc:
        out["current_device"] = None
        out["current_device_error"] = str(exc)
    return out


def main(argv=None):
    ap = command_parser("info", description=__doc__)
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"paddle_rt {paddle_rt.__version__}")
    print(f"device types: {', '.join(info['device_types']) or '(none)'}")
    print(f"current device: {info['current_device']}")
    for p in info["plugins"]:
        print(f"\nplugin {p['device_type']} ({p['sub_device_type']}) ABI {p['version']}"
              f"{' [bundled]' if p['bundled'] else ''}\n  file: {p['path']}")
        if "error" in p:
            print(f"  error: {p['error']}")
        for d in p["devices"]:
            print(f"  device {d['device']}: {_fmt_bytes(d['free'])} free of {_fmt_bytes(d['total'])}")
            props = {k: v for k, v in d["properties"].items()
                     if k not in ("device_type", "sub_device_type", "index", "total_memory")}
            for k, v in props.items():
                print(f"    {k}: {v}")
        print(f"  implemented hooks ({len(p['implemented'])}): {', '.join(p['implemented'])}")
        print(f"  missing hooks ({len(p['missing'])}): {', '.join(p['missing']) or '(none)'}")
    return 0

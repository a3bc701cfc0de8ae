"""``python -m paddle_rt.tools.view_replay LOG OUT [CONF [DEVICE]]``: the viewer's replay of an allocation log in a
fresh process (:func:`paddle_rt.tools.view_data.replay_events`), its result pickled to OUT. A malformed log or
configuration: one line on stderr, exit status 2."""
import pickle
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path, out = argv[0], argv[1]
    conf_text = argv[2] if len(argv) > 2 else ""
    device = argv[3] if len(argv) > 3 else None
    from paddle_rt._core.errors import PaddleRTError
    from paddle_rt.tools import replay, view_data
    try:
        res = view_data.replay_events(path, replay._conf_dict(conf_text), device)
    except PaddleRTError as exc:
        msg = str(exc)
        print(msg[len("replay: "):] if msg.startswith("replay: ") else msg, file=sys.stderr)
        return 2
    with open(out, "wb") as f:
        pickle.dump(res, f, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Command-line tools of paddle_rt (``python -m paddle_rt COMMAND``), in pure Python over the public API."""

"""Collectives (facade over paddle_rt._core.ccl): communicators and collectives over a plugin's xccl hooks.

One thread may issue every rank's call::

    comms = paddle_rt.ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])      # InfiniCCL's CommInitAll
    for c, buf in zip(comms, bufs):                                     # one thread issues every rank
        paddle_rt.ccl.all_reduce(buf, buf, "sum", comm=c, dtype="float32")
    with paddle_rt.ccl.group():                                         # send/recv pairs from one thread
        paddle_rt.ccl.send(a, 1, comm=comms[0], dtype="int32")
        paddle_rt.ccl.recv(b, 0, comm=comms[1], dtype="int32")
"""
from paddle_rt._core.ccl import Communicator, UniqueId, Work, comm_init_all, get_unique_id, group, REDUCE_OPS, DTYPES
from paddle_rt._core.collectives import (
    all_reduce, broadcast, reduce, all_gather, reduce_scatter, send, recv, all_to_all, all_gather_v, reduce_scatter_v,
)
from paddle_rt._core.errors import CollectiveError, CollectiveTimeout

__all__ = ["Communicator", "UniqueId", "Work", "comm_init_all", "get_unique_id", "group", "all_reduce", "broadcast",
           "reduce", "all_gather", "reduce_scatter", "send", "recv", "all_to_all", "all_gather_v", "reduce_scatter_v",
           "REDUCE_OPS", "DTYPES", "CollectiveError", "CollectiveTimeout"]

"""lockd_client: the Python client of lockd, a distributed lock service.

Take a lock, do the work under its fencing token, stop the moment the lease may be gone.

.. code-block:: python

    from lockd_client import Client

    with Client(["127.0.0.1:7170", "127.0.0.1:7171", "127.0.0.1:7172"]) as client:
        with client.lock("payouts/m-1", wait=10) as lk:
            pay(batch, fence=lk.token)      # the store refuses older tokens
            if lk.lost.is_set(): ...        # set at the local deadline, before the server expires us

The asyncio API is :mod:`lockd_client.aio` (:class:`AsyncClient`); fenced PostgreSQL writes are
:mod:`lockd_client.fencing` (psycopg 3, optional).
"""
from . import _quiet  # noqa: F401  (first: before grpc is imported)
from ._options import ClientOptions, RetryPolicy, host_pid
from .aio import (AsyncClient, AsyncElection, AsyncLeaders, AsyncLeadership, AsyncLock,
                  AsyncLockSet, AsyncLostEvent, AsyncWatch)
from .errors import (ClientClosed, Conflict, FenceRejected, InvalidArgument, LockdError, LockLost,
                     NotAcquired, PermissionDenied, ResourceExhausted, SessionLost, SessionNotFound,
                     Unauthenticated, Unavailable)
from .sync import Client, Election, Leaders, Leadership, Lock, LockSet, LostEvent, Watch
from .types import (GroupStatus, HeldLock, Holder, Leader, LockState, Mode, NodeStatus,
                    SessionDetail, Waiter, WatchEvent)

__version__ = "0.1.0"

__all__ = [
    "Client", "Lock", "LockSet", "LostEvent", "Election", "Leadership", "Watch", "Leaders",
    "AsyncClient", "AsyncLock", "AsyncLockSet", "AsyncLostEvent", "AsyncElection", "AsyncLeadership",
    "AsyncWatch", "AsyncLeaders", "WatchEvent",
    "ClientOptions", "RetryPolicy", "host_pid", "Mode",
    "LockState", "Holder", "Waiter", "NodeStatus", "GroupStatus", "SessionDetail", "HeldLock", "Leader",
    "LockdError", "InvalidArgument", "Unauthenticated", "PermissionDenied", "SessionNotFound",
    "Conflict", "ResourceExhausted", "Unavailable", "NotAcquired", "SessionLost", "ClientClosed",
    "LockLost", "FenceRejected",
]

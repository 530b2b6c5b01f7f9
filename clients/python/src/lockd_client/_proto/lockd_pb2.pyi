from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_TTL_OUT_OF_RANGE: _ClassVar[ErrorCode]
    ERROR_CODE_WAIT_TOO_LONG: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_SEMAPHORE_LIMIT: _ClassVar[ErrorCode]
    ERROR_CODE_NAMESPACE_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_NAMESPACE: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_SHARD_MAP: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_CLUSTER_TIMING: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_GROUP: _ClassVar[ErrorCode]
    ERROR_CODE_UNAUTHENTICATED: _ClassVar[ErrorCode]
    ERROR_CODE_PERMISSION_DENIED: _ClassVar[ErrorCode]
    ERROR_CODE_WRONG_NAMESPACE: _ClassVar[ErrorCode]
    ERROR_CODE_ADMIN_DISABLED: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_SESSION_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_MOVE_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_GROUP_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_METHOD_NOT_ALLOWED: _ClassVar[ErrorCode]
    ERROR_CODE_MODE_CONFLICT: _ClassVar[ErrorCode]
    ERROR_CODE_SESSION_EXISTS: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_HOLDER: _ClassVar[ErrorCode]
    ERROR_CODE_STALE_TOKEN: _ClassVar[ErrorCode]
    ERROR_CODE_ALREADY_HELD: _ClassVar[ErrorCode]
    ERROR_CODE_ALREADY_WAITING: _ClassVar[ErrorCode]
    ERROR_CODE_TOO_MANY_REENTRIES: _ClassVar[ErrorCode]
    ERROR_CODE_COUNTER_LIMIT: _ClassVar[ErrorCode]
    ERROR_CODE_MOVE_CONFLICT: _ClassVar[ErrorCode]
    ERROR_CODE_CLUSTER_TIMING_MISMATCH: _ClassVar[ErrorCode]
    ERROR_CODE_NODE_RETIRED: _ClassVar[ErrorCode]
    ERROR_CODE_GROUP_EXISTS: _ClassVar[ErrorCode]
    ERROR_CODE_GROUP_CREATION_IN_PROGRESS: _ClassVar[ErrorCode]
    ERROR_CODE_MEMBER_CHANGE_REFUSED: _ClassVar[ErrorCode]
    ERROR_CODE_BODY_TOO_LARGE: _ClassVar[ErrorCode]
    ERROR_CODE_URI_TOO_LONG: _ClassVar[ErrorCode]
    ERROR_CODE_UNSUPPORTED_MEDIA_TYPE: _ClassVar[ErrorCode]
    ERROR_CODE_QUEUE_FULL: _ClassVar[ErrorCode]
    ERROR_CODE_TOO_MANY_LOCKS: _ClassVar[ErrorCode]
    ERROR_CODE_RATE_LIMITED: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]
    ERROR_CODE_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_NO_LEADER: _ClassVar[ErrorCode]
    ERROR_CODE_WRONG_GROUP: _ClassVar[ErrorCode]
    ERROR_CODE_BUCKET_MOVING: _ClassVar[ErrorCode]
    ERROR_CODE_SESSION_NOT_HERE: _ClassVar[ErrorCode]
    ERROR_CODE_WAIT_OUTCOME_UNKNOWN: _ClassVar[ErrorCode]
    ERROR_CODE_NAMESPACE_VERSION_CONFLICT: _ClassVar[ErrorCode]
    ERROR_CODE_TOO_MANY_SESSIONS: _ClassVar[ErrorCode]
    ERROR_CODE_REQUEST_TIMEOUT: _ClassVar[ErrorCode]
    ERROR_CODE_TOO_MANY_CONNECTIONS: _ClassVar[ErrorCode]
    ERROR_CODE_NAMESPACE_NAME_TAKEN: _ClassVar[ErrorCode]
    ERROR_CODE_WATCH_COMPACTED: _ClassVar[ErrorCode]
    ERROR_CODE_WATCH_TOO_SLOW: _ClassVar[ErrorCode]
    ERROR_CODE_GROUP_NOT_EMPTY: _ClassVar[ErrorCode]
    ERROR_CODE_GROUP_REMOVED: _ClassVar[ErrorCode]

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_EXCLUSIVE: _ClassVar[Mode]
    MODE_SHARED: _ClassVar[Mode]
    MODE_SEMAPHORE: _ClassVar[Mode]

class GroupLeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP_LEASE_STATE_UNSPECIFIED: _ClassVar[GroupLeaseState]
    GROUP_LEASE_STATE_EXTENDED: _ClassVar[GroupLeaseState]
    GROUP_LEASE_STATE_NOT_HERE: _ClassVar[GroupLeaseState]
    GROUP_LEASE_STATE_UNREACHABLE: _ClassVar[GroupLeaseState]
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_TTL_OUT_OF_RANGE: ErrorCode
ERROR_CODE_WAIT_TOO_LONG: ErrorCode
ERROR_CODE_INVALID_SEMAPHORE_LIMIT: ErrorCode
ERROR_CODE_NAMESPACE_NOT_FOUND: ErrorCode
ERROR_CODE_INVALID_NAMESPACE: ErrorCode
ERROR_CODE_INVALID_SHARD_MAP: ErrorCode
ERROR_CODE_INVALID_CLUSTER_TIMING: ErrorCode
ERROR_CODE_INVALID_GROUP: ErrorCode
ERROR_CODE_UNAUTHENTICATED: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode
ERROR_CODE_WRONG_NAMESPACE: ErrorCode
ERROR_CODE_ADMIN_DISABLED: ErrorCode
ERROR_CODE_NOT_FOUND: ErrorCode
ERROR_CODE_SESSION_NOT_FOUND: ErrorCode
ERROR_CODE_MOVE_NOT_FOUND: ErrorCode
ERROR_CODE_GROUP_NOT_FOUND: ErrorCode
ERROR_CODE_METHOD_NOT_ALLOWED: ErrorCode
ERROR_CODE_MODE_CONFLICT: ErrorCode
ERROR_CODE_SESSION_EXISTS: ErrorCode
ERROR_CODE_NOT_HOLDER: ErrorCode
ERROR_CODE_STALE_TOKEN: ErrorCode
ERROR_CODE_ALREADY_HELD: ErrorCode
ERROR_CODE_ALREADY_WAITING: ErrorCode
ERROR_CODE_TOO_MANY_REENTRIES: ErrorCode
ERROR_CODE_COUNTER_LIMIT: ErrorCode
ERROR_CODE_MOVE_CONFLICT: ErrorCode
ERROR_CODE_CLUSTER_TIMING_MISMATCH: ErrorCode
ERROR_CODE_NODE_RETIRED: ErrorCode
ERROR_CODE_GROUP_EXISTS: ErrorCode
ERROR_CODE_GROUP_CREATION_IN_PROGRESS: ErrorCode
ERROR_CODE_MEMBER_CHANGE_REFUSED: ErrorCode
ERROR_CODE_BODY_TOO_LARGE: ErrorCode
ERROR_CODE_URI_TOO_LONG: ErrorCode
ERROR_CODE_UNSUPPORTED_MEDIA_TYPE: ErrorCode
ERROR_CODE_QUEUE_FULL: ErrorCode
ERROR_CODE_TOO_MANY_LOCKS: ErrorCode
ERROR_CODE_RATE_LIMITED: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_UNAVAILABLE: ErrorCode
ERROR_CODE_NO_LEADER: ErrorCode
ERROR_CODE_WRONG_GROUP: ErrorCode
ERROR_CODE_BUCKET_MOVING: ErrorCode
ERROR_CODE_SESSION_NOT_HERE: ErrorCode
ERROR_CODE_WAIT_OUTCOME_UNKNOWN: ErrorCode
ERROR_CODE_NAMESPACE_VERSION_CONFLICT: ErrorCode
ERROR_CODE_TOO_MANY_SESSIONS: ErrorCode
ERROR_CODE_REQUEST_TIMEOUT: ErrorCode
ERROR_CODE_TOO_MANY_CONNECTIONS: ErrorCode
ERROR_CODE_NAMESPACE_NAME_TAKEN: ErrorCode
ERROR_CODE_WATCH_COMPACTED: ErrorCode
ERROR_CODE_WATCH_TOO_SLOW: ErrorCode
ERROR_CODE_GROUP_NOT_EMPTY: ErrorCode
ERROR_CODE_GROUP_REMOVED: ErrorCode
MODE_UNSPECIFIED: Mode
MODE_EXCLUSIVE: Mode
MODE_SHARED: Mode
MODE_SEMAPHORE: Mode
GROUP_LEASE_STATE_UNSPECIFIED: GroupLeaseState
GROUP_LEASE_STATE_EXTENDED: GroupLeaseState
GROUP_LEASE_STATE_NOT_HERE: GroupLeaseState
GROUP_LEASE_STATE_UNREACHABLE: GroupLeaseState

class ContentionRequest(_message.Message):
    __slots__ = ("top", "namespace")
    TOP_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    top: int
    namespace: str
    def __init__(self, top: _Optional[int] = ..., namespace: _Optional[str] = ...) -> None: ...

class HotName(_message.Message):
    __slots__ = ("name", "namespace", "group", "holders", "waiters", "held_for_ms", "longest_wait_ms", "handoffs_per_s", "wait_estimate_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    HELD_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    LONGEST_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    HANDOFFS_PER_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_ESTIMATE_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    group: int
    holders: int
    waiters: int
    held_for_ms: int
    longest_wait_ms: int
    handoffs_per_s: float
    wait_estimate_ms: int
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., group: _Optional[int] = ..., holders: _Optional[int] = ..., waiters: _Optional[int] = ..., held_for_ms: _Optional[int] = ..., longest_wait_ms: _Optional[int] = ..., handoffs_per_s: _Optional[float] = ..., wait_estimate_ms: _Optional[int] = ...) -> None: ...

class ContentionResponse(_message.Message):
    __slots__ = ("top", "namespaces", "scanned", "most_waiters", "longest_waits", "most_handoffs", "longest_held")
    TOP_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    SCANNED_FIELD_NUMBER: _ClassVar[int]
    MOST_WAITERS_FIELD_NUMBER: _ClassVar[int]
    LONGEST_WAITS_FIELD_NUMBER: _ClassVar[int]
    MOST_HANDOFFS_FIELD_NUMBER: _ClassVar[int]
    LONGEST_HELD_FIELD_NUMBER: _ClassVar[int]
    top: int
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    scanned: int
    most_waiters: _containers.RepeatedCompositeFieldContainer[HotName]
    longest_waits: _containers.RepeatedCompositeFieldContainer[HotName]
    most_handoffs: _containers.RepeatedCompositeFieldContainer[HotName]
    longest_held: _containers.RepeatedCompositeFieldContainer[HotName]
    def __init__(self, top: _Optional[int] = ..., namespaces: _Optional[_Iterable[str]] = ..., scanned: _Optional[int] = ..., most_waiters: _Optional[_Iterable[_Union[HotName, _Mapping]]] = ..., longest_waits: _Optional[_Iterable[_Union[HotName, _Mapping]]] = ..., most_handoffs: _Optional[_Iterable[_Union[HotName, _Mapping]]] = ..., longest_held: _Optional[_Iterable[_Union[HotName, _Mapping]]] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("client", "ttl_ms", "namespace", "token")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    client: str
    ttl_ms: int
    namespace: str
    token: str
    def __init__(self, client: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., namespace: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "ttl_ms", "keepalive_every_ms", "group")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_EVERY_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    ttl_ms: int
    keepalive_every_ms: int
    group: int
    def __init__(self, session_id: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., keepalive_every_ms: _Optional[int] = ..., group: _Optional[int] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("session_id", "groups")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    groups: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., groups: _Optional[_Iterable[int]] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("ttl_ms", "groups")
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ttl_ms: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupLease]
    def __init__(self, ttl_ms: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupLease, _Mapping]]] = ...) -> None: ...

class GroupLease(_message.Message):
    __slots__ = ("group", "state", "ttl_ms", "group_moves", "error")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_MOVES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    group: int
    state: GroupLeaseState
    ttl_ms: int
    group_moves: int
    error: str
    def __init__(self, group: _Optional[int] = ..., state: _Optional[_Union[GroupLeaseState, str]] = ..., ttl_ms: _Optional[int] = ..., group_moves: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("session_id", "name", "owner", "mode", "limit", "wait_ms", "reentrant", "token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    REENTRANT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    owner: str
    mode: Mode
    limit: int
    wait_ms: int
    reentrant: bool
    token: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ..., mode: _Optional[_Union[Mode, str]] = ..., limit: _Optional[int] = ..., wait_ms: _Optional[int] = ..., reentrant: bool = ..., token: _Optional[str] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("acquired", "fencing_token", "lease_ttl_ms", "reentry", "holder", "queue_position", "lock_delay_until_ms", "wait_estimate_ms", "group", "group_moves", "lease_started", "adopted_in", "renewed")
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    REENTRY_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_ESTIMATE_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_MOVES_FIELD_NUMBER: _ClassVar[int]
    LEASE_STARTED_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_IN_FIELD_NUMBER: _ClassVar[int]
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    acquired: bool
    fencing_token: int
    lease_ttl_ms: int
    reentry: int
    holder: str
    queue_position: int
    lock_delay_until_ms: int
    wait_estimate_ms: int
    group: int
    group_moves: int
    lease_started: bool
    adopted_in: _containers.RepeatedScalarFieldContainer[int]
    renewed: GroupLease
    def __init__(self, acquired: bool = ..., fencing_token: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., reentry: _Optional[int] = ..., holder: _Optional[str] = ..., queue_position: _Optional[int] = ..., lock_delay_until_ms: _Optional[int] = ..., wait_estimate_ms: _Optional[int] = ..., group: _Optional[int] = ..., group_moves: _Optional[int] = ..., lease_started: bool = ..., adopted_in: _Optional[_Iterable[int]] = ..., renewed: _Optional[_Union[GroupLease, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id", "name", "fencing_token", "token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    fencing_token: int
    token: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ..., fencing_token: _Optional[int] = ..., token: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("remaining",)
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    remaining: int
    def __init__(self, remaining: _Optional[int] = ...) -> None: ...

class ExtendRequest(_message.Message):
    __slots__ = ("session_id", "name", "fencing_token", "token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    fencing_token: int
    token: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ..., fencing_token: _Optional[int] = ..., token: _Optional[str] = ...) -> None: ...

class ExtendResponse(_message.Message):
    __slots__ = ("lease_ttl_ms",)
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    lease_ttl_ms: int
    def __init__(self, lease_ttl_ms: _Optional[int] = ...) -> None: ...

class CheckTokenRequest(_message.Message):
    __slots__ = ("name", "fencing_token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    fencing_token: int
    def __init__(self, name: _Optional[str] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class CheckTokenResponse(_message.Message):
    __slots__ = ("valid", "newest_token")
    VALID_FIELD_NUMBER: _ClassVar[int]
    NEWEST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    newest_token: int
    def __init__(self, valid: bool = ..., newest_token: _Optional[int] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("name", "token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    token: str
    def __init__(self, name: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class Holder(_message.Message):
    __slots__ = ("session_id", "owner", "fencing_token", "mode", "held_for_ms", "reentry")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HELD_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    REENTRY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    owner: str
    fencing_token: int
    mode: Mode
    held_for_ms: int
    reentry: int
    def __init__(self, session_id: _Optional[str] = ..., owner: _Optional[str] = ..., fencing_token: _Optional[int] = ..., mode: _Optional[_Union[Mode, str]] = ..., held_for_ms: _Optional[int] = ..., reentry: _Optional[int] = ...) -> None: ...

class Waiter(_message.Message):
    __slots__ = ("session_id", "owner", "mode", "position", "waited_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    WAITED_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    owner: str
    mode: Mode
    position: int
    waited_ms: int
    def __init__(self, session_id: _Optional[str] = ..., owner: _Optional[str] = ..., mode: _Optional[_Union[Mode, str]] = ..., position: _Optional[int] = ..., waited_ms: _Optional[int] = ...) -> None: ...

class LockState(_message.Message):
    __slots__ = ("name", "namespace", "holders", "waiters", "lock_delay_until_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    holders: _containers.RepeatedCompositeFieldContainer[Holder]
    waiters: _containers.RepeatedCompositeFieldContainer[Waiter]
    lock_delay_until_ms: int
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., holders: _Optional[_Iterable[_Union[Holder, _Mapping]]] = ..., waiters: _Optional[_Iterable[_Union[Waiter, _Mapping]]] = ..., lock_delay_until_ms: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("id", "leader", "term", "members", "applied_index", "revision", "preferred_leader")
    ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_LEADER_FIELD_NUMBER: _ClassVar[int]
    id: int
    leader: int
    term: int
    members: _containers.RepeatedScalarFieldContainer[int]
    applied_index: int
    revision: int
    preferred_leader: int
    def __init__(self, id: _Optional[int] = ..., leader: _Optional[int] = ..., term: _Optional[int] = ..., members: _Optional[_Iterable[int]] = ..., applied_index: _Optional[int] = ..., revision: _Optional[int] = ..., preferred_leader: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "pid", "groups", "serving_names")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SERVING_NAMES_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    pid: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupStatus]
    serving_names: bool
    def __init__(self, node_id: _Optional[int] = ..., pid: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ..., serving_names: bool = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class HeldLock(_message.Message):
    __slots__ = ("name", "fencing_token", "group")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    name: str
    fencing_token: int
    group: int
    def __init__(self, name: _Optional[str] = ..., fencing_token: _Optional[int] = ..., group: _Optional[int] = ...) -> None: ...

class QueuedWait(_message.Message):
    __slots__ = ("name", "queue_position", "group")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_position: int
    group: int
    def __init__(self, name: _Optional[str] = ..., queue_position: _Optional[int] = ..., group: _Optional[int] = ...) -> None: ...

class SessionDetail(_message.Message):
    __slots__ = ("session_id", "client", "ttl_ms", "held", "waits", "unavailable_groups")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    client: str
    ttl_ms: int
    held: _containers.RepeatedCompositeFieldContainer[HeldLock]
    waits: _containers.RepeatedCompositeFieldContainer[QueuedWait]
    unavailable_groups: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., client: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., held: _Optional[_Iterable[_Union[HeldLock, _Mapping]]] = ..., waits: _Optional[_Iterable[_Union[QueuedWait, _Mapping]]] = ..., unavailable_groups: _Optional[_Iterable[int]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("after", "limit")
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after: str
    limit: int
    def __init__(self, after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class SessionSummary(_message.Message):
    __slots__ = ("session_id", "client", "ttl_ms", "held", "waits")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    client: str
    ttl_ms: int
    held: int
    waits: int
    def __init__(self, session_id: _Optional[str] = ..., client: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., held: _Optional[int] = ..., waits: _Optional[int] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionSummary]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionSummary, _Mapping]]] = ...) -> None: ...

class ReportLeaseExpiredRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ReportLeaseExpiredResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportFencingRejectedRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ReportFencingRejectedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("request_id", "open", "attach", "keepalive", "acquire", "release", "close", "inspect")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    INSPECT_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    open: OpenSessionRequest
    attach: str
    keepalive: KeepAliveRequest
    acquire: AcquireRequest
    release: ReleaseRequest
    close: CloseSessionRequest
    inspect: InspectRequest
    def __init__(self, request_id: _Optional[int] = ..., open: _Optional[_Union[OpenSessionRequest, _Mapping]] = ..., attach: _Optional[str] = ..., keepalive: _Optional[_Union[KeepAliveRequest, _Mapping]] = ..., acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., close: _Optional[_Union[CloseSessionRequest, _Mapping]] = ..., inspect: _Optional[_Union[InspectRequest, _Mapping]] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("request_id", "opened", "keepalive", "acquired", "queued", "released", "closed", "granted", "wait_ended", "session_ended", "error", "lease_extended", "state")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    WAIT_ENDED_FIELD_NUMBER: _ClassVar[int]
    SESSION_ENDED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXTENDED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    opened: OpenSessionResponse
    keepalive: KeepAliveResponse
    acquired: AcquireResponse
    queued: Queued
    released: ReleaseResponse
    closed: CloseSessionResponse
    granted: Granted
    wait_ended: WaitEnded
    session_ended: SessionEnded
    error: Error
    lease_extended: LeaseExtended
    state: LockState
    def __init__(self, request_id: _Optional[int] = ..., opened: _Optional[_Union[OpenSessionResponse, _Mapping]] = ..., keepalive: _Optional[_Union[KeepAliveResponse, _Mapping]] = ..., acquired: _Optional[_Union[AcquireResponse, _Mapping]] = ..., queued: _Optional[_Union[Queued, _Mapping]] = ..., released: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., closed: _Optional[_Union[CloseSessionResponse, _Mapping]] = ..., granted: _Optional[_Union[Granted, _Mapping]] = ..., wait_ended: _Optional[_Union[WaitEnded, _Mapping]] = ..., session_ended: _Optional[_Union[SessionEnded, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., lease_extended: _Optional[_Union[LeaseExtended, _Mapping]] = ..., state: _Optional[_Union[LockState, _Mapping]] = ...) -> None: ...

class LeaseExtended(_message.Message):
    __slots__ = ("group", "extended_by_ms", "remaining_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    EXTENDED_BY_MS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    group: int
    extended_by_ms: int
    remaining_ms: int
    def __init__(self, group: _Optional[int] = ..., extended_by_ms: _Optional[int] = ..., remaining_ms: _Optional[int] = ...) -> None: ...

class Queued(_message.Message):
    __slots__ = ("group", "waiter", "name", "position", "wait_estimate_ms", "lease_started", "renewed")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    WAITER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    WAIT_ESTIMATE_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_STARTED_FIELD_NUMBER: _ClassVar[int]
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    group: int
    waiter: int
    name: str
    position: int
    wait_estimate_ms: int
    lease_started: bool
    renewed: GroupLease
    def __init__(self, group: _Optional[int] = ..., waiter: _Optional[int] = ..., name: _Optional[str] = ..., position: _Optional[int] = ..., wait_estimate_ms: _Optional[int] = ..., lease_started: bool = ..., renewed: _Optional[_Union[GroupLease, _Mapping]] = ...) -> None: ...

class Granted(_message.Message):
    __slots__ = ("group", "waiter", "name", "fencing_token", "lease_ttl_ms", "group_moves")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    WAITER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_MOVES_FIELD_NUMBER: _ClassVar[int]
    group: int
    waiter: int
    name: str
    fencing_token: int
    lease_ttl_ms: int
    group_moves: int
    def __init__(self, group: _Optional[int] = ..., waiter: _Optional[int] = ..., name: _Optional[str] = ..., fencing_token: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., group_moves: _Optional[int] = ...) -> None: ...

class WaitEnded(_message.Message):
    __slots__ = ("group", "waiter", "name", "reason")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    WAITER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    group: int
    waiter: int
    name: str
    reason: str
    def __init__(self, group: _Optional[int] = ..., waiter: _Optional[int] = ..., name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SessionEnded(_message.Message):
    __slots__ = ("group", "reason")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    group: int
    reason: str
    def __init__(self, group: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("status", "code", "message", "retry_after_ms", "error_code")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    status: int
    code: str
    message: str
    retry_after_ms: int
    error_code: ErrorCode
    def __init__(self, status: _Optional[int] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., retry_after_ms: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BackupResponse(_message.Message):
    __slots__ = ("document",)
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    document: bytes
    def __init__(self, document: _Optional[bytes] = ...) -> None: ...

class NamespaceSpec(_message.Message):
    __slots__ = ("name", "prefix", "min_ttl_ms", "max_ttl_ms", "default_ttl_ms", "max_waiters_per_name", "max_locks_per_session", "lock_delay_ms", "ops_per_s", "safety", "fenced_resource", "token_required", "max_sessions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    MIN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITERS_PER_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_LOCKS_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    OPS_PER_S_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FIELD_NUMBER: _ClassVar[int]
    FENCED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    prefix: str
    min_ttl_ms: int
    max_ttl_ms: int
    default_ttl_ms: int
    max_waiters_per_name: int
    max_locks_per_session: int
    lock_delay_ms: int
    ops_per_s: int
    safety: str
    fenced_resource: str
    token_required: bool
    max_sessions: int
    def __init__(self, name: _Optional[str] = ..., prefix: _Optional[str] = ..., min_ttl_ms: _Optional[int] = ..., max_ttl_ms: _Optional[int] = ..., default_ttl_ms: _Optional[int] = ..., max_waiters_per_name: _Optional[int] = ..., max_locks_per_session: _Optional[int] = ..., lock_delay_ms: _Optional[int] = ..., ops_per_s: _Optional[int] = ..., safety: _Optional[str] = ..., fenced_resource: _Optional[str] = ..., token_required: bool = ..., max_sessions: _Optional[int] = ...) -> None: ...

class ListNamespacesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNamespacesResponse(_message.Message):
    __slots__ = ("version", "namespaces")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    version: int
    namespaces: _containers.RepeatedCompositeFieldContainer[NamespaceSpec]
    def __init__(self, version: _Optional[int] = ..., namespaces: _Optional[_Iterable[_Union[NamespaceSpec, _Mapping]]] = ...) -> None: ...

class PutNamespaceRequest(_message.Message):
    __slots__ = ("expected_version", "namespace", "bearer_token", "clear_token")
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BEARER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CLEAR_TOKEN_FIELD_NUMBER: _ClassVar[int]
    expected_version: int
    namespace: NamespaceSpec
    bearer_token: str
    clear_token: bool
    def __init__(self, expected_version: _Optional[int] = ..., namespace: _Optional[_Union[NamespaceSpec, _Mapping]] = ..., bearer_token: _Optional[str] = ..., clear_token: bool = ...) -> None: ...

class PutNamespaceResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class DeleteNamespaceRequest(_message.Message):
    __slots__ = ("expected_version", "name")
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    expected_version: int
    name: str
    def __init__(self, expected_version: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteNamespaceResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class SetDrainingRequest(_message.Message):
    __slots__ = ("node_id", "draining")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    draining: bool
    def __init__(self, node_id: _Optional[int] = ..., draining: bool = ...) -> None: ...

class CreateGroupRequest(_message.Message):
    __slots__ = ("group", "nodes", "allow_zone_majority")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ALLOW_ZONE_MAJORITY_FIELD_NUMBER: _ClassVar[int]
    group: int
    nodes: _containers.RepeatedScalarFieldContainer[int]
    allow_zone_majority: bool
    def __init__(self, group: _Optional[int] = ..., nodes: _Optional[_Iterable[int]] = ..., allow_zone_majority: bool = ...) -> None: ...

class LockGroup(_message.Message):
    __slots__ = ("group", "nodes", "born_epoch", "ready", "placed_at_term", "placed_at_index")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BORN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    PLACED_AT_TERM_FIELD_NUMBER: _ClassVar[int]
    PLACED_AT_INDEX_FIELD_NUMBER: _ClassVar[int]
    group: int
    nodes: _containers.RepeatedScalarFieldContainer[int]
    born_epoch: int
    ready: bool
    placed_at_term: int
    placed_at_index: int
    def __init__(self, group: _Optional[int] = ..., nodes: _Optional[_Iterable[int]] = ..., born_epoch: _Optional[int] = ..., ready: bool = ..., placed_at_term: _Optional[int] = ..., placed_at_index: _Optional[int] = ...) -> None: ...

class RemoveGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: int
    def __init__(self, group: _Optional[int] = ...) -> None: ...

class RemoveGroupResponse(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: int
    def __init__(self, group: _Optional[int] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[LockGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[LockGroup, _Mapping]]] = ...) -> None: ...

class ShardMapRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupBuckets(_message.Message):
    __slots__ = ("group", "buckets", "bucket_count", "owned", "frozen")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_COUNT_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    group: int
    buckets: str
    bucket_count: int
    owned: str
    frozen: str
    def __init__(self, group: _Optional[int] = ..., buckets: _Optional[str] = ..., bucket_count: _Optional[int] = ..., owned: _Optional[str] = ..., frozen: _Optional[str] = ...) -> None: ...

class ShardMapResponse(_message.Message):
    __slots__ = ("map_version", "groups")
    MAP_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    map_version: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupBuckets]
    def __init__(self, map_version: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupBuckets, _Mapping]]] = ...) -> None: ...

class MoveBucketsRequest(_message.Message):
    __slots__ = ("buckets", "to_group")
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    TO_GROUP_FIELD_NUMBER: _ClassVar[int]
    buckets: str
    to_group: int
    def __init__(self, buckets: _Optional[str] = ..., to_group: _Optional[int] = ...) -> None: ...

class MoveBucketsResponse(_message.Message):
    __slots__ = ("chunks", "buckets_moved", "locks", "holders", "waits_requeued", "resumed", "map_version", "elapsed_ms")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_MOVED_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    WAITS_REQUEUED_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    MAP_VERSION_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    buckets_moved: int
    locks: int
    holders: int
    waits_requeued: int
    resumed: int
    map_version: int
    elapsed_ms: int
    def __init__(self, chunks: _Optional[int] = ..., buckets_moved: _Optional[int] = ..., locks: _Optional[int] = ..., holders: _Optional[int] = ..., waits_requeued: _Optional[int] = ..., resumed: _Optional[int] = ..., map_version: _Optional[int] = ..., elapsed_ms: _Optional[int] = ...) -> None: ...

class ListMembersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("group", "role", "leader", "term", "committed_index", "applied_index", "revision", "log_bytes", "snapshot_bytes")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    group: int
    role: str
    leader: int
    term: int
    committed_index: int
    applied_index: int
    revision: int
    log_bytes: int
    snapshot_bytes: int
    def __init__(self, group: _Optional[int] = ..., role: _Optional[str] = ..., leader: _Optional[int] = ..., term: _Optional[int] = ..., committed_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., revision: _Optional[int] = ..., log_bytes: _Optional[int] = ..., snapshot_bytes: _Optional[int] = ...) -> None: ...

class NodeStatusReport(_message.Message):
    __slots__ = ("node_id", "peer_addr", "error", "zone", "version", "pid", "uptime_s", "ready", "not_ready", "replicas")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    NOT_READY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    peer_addr: str
    error: str
    zone: str
    version: str
    pid: int
    uptime_s: int
    ready: bool
    not_ready: _containers.RepeatedScalarFieldContainer[str]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    def __init__(self, node_id: _Optional[int] = ..., peer_addr: _Optional[str] = ..., error: _Optional[str] = ..., zone: _Optional[str] = ..., version: _Optional[str] = ..., pid: _Optional[int] = ..., uptime_s: _Optional[int] = ..., ready: bool = ..., not_ready: _Optional[_Iterable[str]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatusReport]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatusReport, _Mapping]]] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("node_id", "peer_addr", "role", "leader", "lag", "draining", "zone", "last_contact_ms", "reachable")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    LAST_CONTACT_MS_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    peer_addr: str
    role: str
    leader: bool
    lag: int
    draining: bool
    zone: str
    last_contact_ms: int
    reachable: bool
    def __init__(self, node_id: _Optional[int] = ..., peer_addr: _Optional[str] = ..., role: _Optional[str] = ..., leader: bool = ..., lag: _Optional[int] = ..., draining: bool = ..., zone: _Optional[str] = ..., last_contact_ms: _Optional[int] = ..., reachable: bool = ...) -> None: ...

class GroupMembers(_message.Message):
    __slots__ = ("group", "leader", "joint", "members")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    JOINT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    group: int
    leader: int
    joint: bool
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, group: _Optional[int] = ..., leader: _Optional[int] = ..., joint: bool = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class ListMembersResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupMembers]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupMembers, _Mapping]]] = ...) -> None: ...

class AddMemberRequest(_message.Message):
    __slots__ = ("node_id", "peer_addr", "groups", "allow_zone_majority")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_ZONE_MAJORITY_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    peer_addr: str
    groups: _containers.RepeatedScalarFieldContainer[int]
    allow_zone_majority: bool
    def __init__(self, node_id: _Optional[int] = ..., peer_addr: _Optional[str] = ..., groups: _Optional[_Iterable[int]] = ..., allow_zone_majority: bool = ...) -> None: ...

class RemoveMemberRequest(_message.Message):
    __slots__ = ("node_id", "groups", "allow_zone_majority")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_ZONE_MAJORITY_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    allow_zone_majority: bool
    def __init__(self, node_id: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ..., allow_zone_majority: bool = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("name", "prefix", "after")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    name: str
    prefix: str
    after: _containers.RepeatedCompositeFieldContainer[WatchPosition]
    def __init__(self, name: _Optional[str] = ..., prefix: _Optional[str] = ..., after: _Optional[_Iterable[_Union[WatchPosition, _Mapping]]] = ...) -> None: ...

class WatchPosition(_message.Message):
    __slots__ = ("group", "index", "events")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    group: int
    index: int
    events: int
    def __init__(self, group: _Optional[int] = ..., index: _Optional[int] = ..., events: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("group", "index", "time_ms", "kind", "name", "session_id", "owner", "fencing_token", "mode", "limit", "cause", "waiter", "position", "deadline_ms", "waited_ms", "held_ms", "lock_delay_until_ms", "lease_ttl_ms", "resume", "unix_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    WAITER_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    WAITED_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_MS_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    group: int
    index: int
    time_ms: int
    kind: str
    name: str
    session_id: str
    owner: str
    fencing_token: int
    mode: Mode
    limit: int
    cause: str
    waiter: int
    position: int
    deadline_ms: int
    waited_ms: int
    held_ms: int
    lock_delay_until_ms: int
    lease_ttl_ms: int
    resume: _containers.RepeatedCompositeFieldContainer[WatchPosition]
    unix_ms: int
    def __init__(self, group: _Optional[int] = ..., index: _Optional[int] = ..., time_ms: _Optional[int] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., session_id: _Optional[str] = ..., owner: _Optional[str] = ..., fencing_token: _Optional[int] = ..., mode: _Optional[_Union[Mode, str]] = ..., limit: _Optional[int] = ..., cause: _Optional[str] = ..., waiter: _Optional[int] = ..., position: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., waited_ms: _Optional[int] = ..., held_ms: _Optional[int] = ..., lock_delay_until_ms: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., resume: _Optional[_Iterable[_Union[WatchPosition, _Mapping]]] = ..., unix_ms: _Optional[int] = ...) -> None: ...

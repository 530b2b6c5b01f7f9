"""Typed gRPC method stubs of ``lockd.v1.Lock`` over a ``grpc.aio`` channel.

Written by hand rather than generated: the generated ``*_pb2_grpc`` module is untyped and refuses
to load on a grpcio older than the grpcio-tools that generated it.
"""
from __future__ import annotations

import grpc.aio

from ._proto import lockd_pb2 as pb

_S = "/lockd.v1.Lock/"
_UU = grpc.aio.UnaryUnaryMultiCallable
_SS = grpc.aio.StreamStreamMultiCallable
_US = grpc.aio.UnaryStreamMultiCallable


class LockStub:
    """The calls of the ``Lock`` service the client uses."""

    def __init__(self, ch: grpc.aio.Channel) -> None:
        self.OpenSession: _UU[pb.OpenSessionRequest, pb.OpenSessionResponse] = ch.unary_unary(
            _S + "OpenSession", pb.OpenSessionRequest.SerializeToString, pb.OpenSessionResponse.FromString)
        self.KeepAlive: _UU[pb.KeepAliveRequest, pb.KeepAliveResponse] = ch.unary_unary(
            _S + "KeepAlive", pb.KeepAliveRequest.SerializeToString, pb.KeepAliveResponse.FromString)
        self.CloseSession: _UU[pb.CloseSessionRequest, pb.CloseSessionResponse] = ch.unary_unary(
            _S + "CloseSession", pb.CloseSessionRequest.SerializeToString, pb.CloseSessionResponse.FromString)
        self.Acquire: _UU[pb.AcquireRequest, pb.AcquireResponse] = ch.unary_unary(
            _S + "Acquire", pb.AcquireRequest.SerializeToString, pb.AcquireResponse.FromString)
        self.Release: _UU[pb.ReleaseRequest, pb.ReleaseResponse] = ch.unary_unary(
            _S + "Release", pb.ReleaseRequest.SerializeToString, pb.ReleaseResponse.FromString)
        self.Inspect: _UU[pb.InspectRequest, pb.LockState] = ch.unary_unary(
            _S + "Inspect", pb.InspectRequest.SerializeToString, pb.LockState.FromString)
        self.CheckToken: _UU[pb.CheckTokenRequest, pb.CheckTokenResponse] = ch.unary_unary(
            _S + "CheckToken", pb.CheckTokenRequest.SerializeToString,
            pb.CheckTokenResponse.FromString)
        self.Status: _UU[pb.StatusRequest, pb.StatusResponse] = ch.unary_unary(
            _S + "Status", pb.StatusRequest.SerializeToString, pb.StatusResponse.FromString)
        self.GetSession: _UU[pb.GetSessionRequest, pb.SessionDetail] = ch.unary_unary(
            _S + "GetSession", pb.GetSessionRequest.SerializeToString, pb.SessionDetail.FromString)
        self.ReportLeaseExpired: _UU[pb.ReportLeaseExpiredRequest, pb.ReportLeaseExpiredResponse] = ch.unary_unary(
            _S + "ReportLeaseExpired", pb.ReportLeaseExpiredRequest.SerializeToString,
            pb.ReportLeaseExpiredResponse.FromString)
        self.ReportFencingRejected: _UU[pb.ReportFencingRejectedRequest,
                                        pb.ReportFencingRejectedResponse] = ch.unary_unary(
            _S + "ReportFencingRejected", pb.ReportFencingRejectedRequest.SerializeToString,
            pb.ReportFencingRejectedResponse.FromString)
        self.Session: _SS[pb.SessionRequest, pb.SessionEvent] = ch.stream_stream(
            _S + "Session", pb.SessionRequest.SerializeToString, pb.SessionEvent.FromString)
        self.Watch: _US[pb.WatchRequest, pb.WatchEvent] = ch.unary_stream(
            _S + "Watch", pb.WatchRequest.SerializeToString, pb.WatchEvent.FromString)

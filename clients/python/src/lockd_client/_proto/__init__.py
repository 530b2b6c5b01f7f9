"""Protobuf messages of lockd.v1, generated from proto/lockd/v1/lockd.proto by regen_proto.py."""

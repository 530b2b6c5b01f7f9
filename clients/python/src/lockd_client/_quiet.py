"""grpc-core logs each failed connect at INFO and each refused TLS handshake at ERROR on stderr;
this package reports them as typed errors with a hint instead (``errors.py``). Imported before
grpc is; set ``GRPC_VERBOSITY`` yourself (before importing ``lockd_client``) to see grpc-core's
lines again."""
import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")

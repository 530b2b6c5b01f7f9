"""grpc-core logs each failed TLS handshake and connect at INFO on stderr; this package reports
them as typed errors instead. Imported before grpc is; set ``GRPC_VERBOSITY`` yourself (before
importing ``lockd_client``) to see grpc-core's lines again."""
import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

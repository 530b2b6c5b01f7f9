package dev.lockd.client;

/** A grant: what a {@link Lock} wraps. */
final class Hold {
  final String name;
  final long token;
  final String sessionId;
  final Leases.LockLease lease;
  final String owner;
  final Mode mode;
  final int reentry;
  long id;

  Hold(String name, long token, String sessionId, Leases.LockLease lease, String owner, Mode mode,
      int reentry) {
    this.name = name;
    this.token = token;
    this.sessionId = sessionId;
    this.lease = lease;
    this.owner = owner;
    this.mode = mode;
    this.reentry = reentry;
  }
}

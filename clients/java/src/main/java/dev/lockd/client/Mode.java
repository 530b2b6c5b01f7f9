package dev.lockd.client;

/** How a lock may be shared. Every user of a name must use the same mode (and limit). */
public enum Mode {
  /** One holder. */
  EXCLUSIVE,
  /** Any number of shared holders, never beside an exclusive one; a reader behind a waiting
   * writer waits. */
  SHARED,
  /** Up to {@code limit} holders (1..=10 000), each with its own token. */
  SEMAPHORE;

  dev.lockd.v1.Mode toProto() {
    switch (this) {
      case SHARED:
        return dev.lockd.v1.Mode.MODE_SHARED;
      case SEMAPHORE:
        return dev.lockd.v1.Mode.MODE_SEMAPHORE;
      default:
        return dev.lockd.v1.Mode.MODE_EXCLUSIVE;
    }
  }

  static Mode fromProto(dev.lockd.v1.Mode m) {
    switch (m) {
      case MODE_SHARED:
        return SHARED;
      case MODE_SEMAPHORE:
        return SEMAPHORE;
      default:
        return EXCLUSIVE;
    }
  }
}

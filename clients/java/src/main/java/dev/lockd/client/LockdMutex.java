package dev.lockd.client;

import java.time.Duration;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

/**
 * A mutex across processes in the shape of Curator's {@code InterProcessMutex}: {@link
 * #acquire()}, {@link #acquire(long, TimeUnit)}, {@link #release()}, re-entrant per thread.
 * Each thread of the process is its own owner on the lock (so two threads contend like two
 * processes), and a thread that acquires again only counts up locally.
 *
 * <p>Unlike Curator's, the holder gets a fencing token ({@link #lock()}) and a lost signal: a
 * paused process can lose the lock while it believes it holds it, so fence every write.
 */
public final class LockdMutex {
  private final LockdClient client;
  private final String name;
  private final Map<Thread, Held> threads = new ConcurrentHashMap<>();

  private static final class Held {
    final Lock lock;
    int count = 1;

    Held(Lock lock) {
      this.lock = lock;
    }
  }

  LockdMutex(LockdClient client, String name) {
    this.client = client;
    this.name = name;
  }

  private String owner() {
    return client.clientName() + "#" + Thread.currentThread().getId();
  }

  /** Takes the mutex, waiting as long as it takes. */
  public void acquire() {
    if (!take(LockdClient.FOREVER)) {
      throw new NotAcquiredException("the wait for '" + name + "' ended without a grant");
    }
  }

  /** Takes the mutex, waiting up to {@code time}; returns whether it was taken. */
  public boolean acquire(long time, TimeUnit unit) {
    return take(Duration.ofNanos(unit.toNanos(time)));
  }

  private boolean take(Duration wait) {
    Held h = threads.get(Thread.currentThread());
    if (h != null && !h.lock.isLost()) {
      h.count++;
      return true;
    }
    if (h != null) {
      // Lost under this thread: start afresh (the old hold is gone on the service).
      threads.remove(Thread.currentThread());
      try {
        h.lock.release();
      } catch (LockdException ignored) {
        // it is lost anyway
      }
    }
    try {
      Lock lk = client.newLock(name).owner(owner()).waitFor(wait).acquire();
      threads.put(Thread.currentThread(), new Held(lk));
      return true;
    } catch (NotAcquiredException e) {
      return false;
    }
  }

  /**
   * Gives back one acquire of the calling thread; the last one releases the lock.
   *
   * @throws IllegalMonitorStateException if the calling thread does not hold the mutex
   * @throws LockLostException if the lock was lost while held (the work may have overlapped the
   *     next holder's)
   */
  public void release() {
    Held h = threads.get(Thread.currentThread());
    if (h == null) {
      throw new IllegalMonitorStateException("the calling thread does not hold '" + name + "'");
    }
    if (--h.count > 0) {
      return;
    }
    threads.remove(Thread.currentThread());
    h.lock.close();
  }

  /** Whether a thread of this process holds the mutex. */
  public boolean isAcquiredInThisProcess() {
    return threads.values().stream().anyMatch(h -> !h.lock.isLost());
  }

  /** Whether the calling thread holds the mutex. */
  public boolean isOwnedByCurrentThread() {
    Held h = threads.get(Thread.currentThread());
    return h != null && !h.lock.isLost();
  }

  /** The calling thread's lock (its token and lost signal), while it holds the mutex. */
  public Optional<Lock> lock() {
    Held h = threads.get(Thread.currentThread());
    return h == null ? Optional.empty() : Optional.of(h.lock);
  }
}

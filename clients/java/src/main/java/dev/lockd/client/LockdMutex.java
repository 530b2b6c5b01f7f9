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
 * paused process can lose the lock while it believes it holds it, so fence every write. A thread
 * whose hold was lost cannot acquire again on top of it: its re-entrant {@code acquire} throws
 * {@link LockLostException} and leaves the count as it was; once it has released every acquire
 * (the last {@link #release()} throws {@link LockLostException} too), its next acquire starts
 * afresh.
 */
public final class LockdMutex {
  private final LockdClient client;
  private final String name;
  final Map<Thread, Held> threads = new ConcurrentHashMap<>();

  static final class Held {
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

  /** Takes the mutex, waiting as long as it takes.
   *
   * @throws LockLostException if the calling thread holds it already and that hold was lost */
  public void acquire() {
    if (!take(LockdClient.FOREVER)) {
      throw new NotAcquiredException("the wait for '" + name + "' ended without a grant");
    }
  }

  /** Takes the mutex, waiting up to {@code time}; returns whether it was taken.
   *
   * @throws LockLostException if the calling thread holds it already and that hold was lost */
  public boolean acquire(long time, TimeUnit unit) {
    return take(Duration.ofNanos(unit.toNanos(time)));
  }

  private boolean take(Duration wait) {
    Held h = threads.get(Thread.currentThread());
    if (h != null) {
      if (h.lock.isLost()) {
        // The caller's outer acquires still believe they hold it: taking it afresh here would
        // unbalance them (and hide the loss). Its releases end it; then acquire starts afresh.
        throw new LockLostException("the lock '" + name + "' this thread holds " + h.count
            + " time(s) was lost (" + h.lock.lostReason() + "); release it that often first");
      }
      h.count++;
      return true;
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

  /** How many acquires the calling thread holds (0: none). */
  public int holdCount() {
    Held h = threads.get(Thread.currentThread());
    return h == null ? 0 : h.count;
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

package dev.lockd.client;

import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.logging.Level;

/**
 * A leader election in the shape of Curator's {@code LeaderLatch}: {@link #start()} campaigns in
 * the background (and again after a lost term), {@link #await()} blocks until this participant
 * leads, {@link #hasLeadership()} tells, listeners hear of every change, and {@link #close()}
 * resigns. Unlike Curator's, the leader holds a fencing token ({@link #token()}): fence every
 * side effect of the term with it.
 *
 * <pre>{@code
 * try (LeaderLatch latch = client.leaderLatch("leaders/partition-9", "node-a")) {
 *   latch.start();
 *   latch.await();
 *   while (latch.hasLeadership()) { lead(latch.token().getAsLong()); }
 * }
 * }</pre>
 */
public final class LeaderLatch implements AutoCloseable {
  /** Where a latch is in its life. */
  public enum State { LATENT, STARTED, CLOSED }

  private final LockdClient client;
  private final Election election;
  private final String id;
  private final CopyOnWriteArrayList<LeaderLatchListener> listeners =
      new CopyOnWriteArrayList<>();
  private final Object mu = new Object();
  private volatile State state = State.LATENT;
  private volatile Leadership leadership;
  private Thread thread;

  LeaderLatch(LockdClient client, String name, String id) {
    Names.checkOwner(id);
    this.client = client;
    this.election = new Election(client, name);
    this.id = id;
  }

  /** This participant's campaign value. */
  public String getId() {
    return id;
  }

  public State getState() {
    return state;
  }

  /** Starts campaigning in the background. Once only. */
  public void start() {
    synchronized (mu) {
      if (state != State.LATENT) {
        throw new IllegalStateException("the latch was already started");
      }
      state = State.STARTED;
      thread = new Thread(this::run, "lockd-leader-latch-" + election.name());
      thread.setDaemon(true);
      thread.start();
    }
  }

  public void addListener(LeaderLatchListener l) {
    listeners.add(l);
  }

  public void removeListener(LeaderLatchListener l) {
    listeners.remove(l);
  }

  private void tell(boolean leader) {
    for (LeaderLatchListener l : listeners) {
      try {
        if (leader) {
          l.isLeader();
        } else {
          l.notLeader();
        }
      } catch (RuntimeException e) {
        Engine.LOG.log(Level.WARNING, "lockd leader latch listener failed", e);
      }
    }
  }

  private void run() {
    int failures = 0;
    while (state == State.STARTED) {
      Leadership l;
      try {
        l = election.campaign(id);
        failures = 0;
      } catch (ClientClosedException e) {
        return;
      } catch (LockdException e) {
        if (state != State.STARTED) {
          return;
        }
        Engine.LOG.fine(() -> "lockd: campaign for " + election.name() + " failed: " + e);
        try {
          Engine.sleep(client.engine.opts.retry.delay(Math.min(failures++, 6), e));
        } catch (ClientClosedException ie) {
          return;
        }
        continue;
      }
      synchronized (mu) {
        if (state != State.STARTED) {
          l.resign();
          return;
        }
        leadership = l;
        mu.notifyAll();
      }
      tell(true);
      try {
        l.lost().get();
      } catch (InterruptedException e) {
        // closed: close() resigns
        return;
      } catch (ExecutionException e) {
        // never completes exceptionally
      }
      synchronized (mu) {
        if (leadership == l) {
          leadership = null;
        }
      }
      Engine.LOG.warning("lockd: leadership of " + election.name() + " lost: "
          + l.lock().lostReason());
      tell(false);
    }
  }

  /** Whether this participant leads now (its lock held and not lost). */
  public boolean hasLeadership() {
    Leadership l = leadership;
    return state == State.STARTED && l != null && !l.isLost();
  }

  /** The current term's leadership, while this participant leads. */
  public Optional<Leadership> leadership() {
    Leadership l = leadership;
    return l != null && !l.isLost() ? Optional.of(l) : Optional.empty();
  }

  /** The current term's fencing token, while this participant leads. */
  public OptionalLong token() {
    Leadership l = leadership;
    return l != null && !l.isLost() ? OptionalLong.of(l.token()) : OptionalLong.empty();
  }

  /** Blocks until this participant leads. */
  public void await() throws InterruptedException {
    synchronized (mu) {
      while (!hasLeadership()) {
        if (state != State.STARTED) {
          throw new IllegalStateException("the latch is " + state);
        }
        mu.wait(100);
      }
    }
  }

  /** Blocks until this participant leads or {@code timeout} passes; returns whether it leads. */
  public boolean await(long timeout, TimeUnit unit) throws InterruptedException {
    long end = System.nanoTime() + unit.toNanos(timeout);
    synchronized (mu) {
      while (!hasLeadership()) {
        long left = end - System.nanoTime();
        if (left <= 0 || state != State.STARTED) {
          return false;
        }
        TimeUnit.NANOSECONDS.timedWait(mu, Math.min(left, TimeUnit.MILLISECONDS.toNanos(100)));
      }
      return true;
    }
  }

  /** The current leader, whoever it is (a linearizable read). */
  public Optional<Leader> getLeader() {
    return election.leader();
  }

  /** Stops campaigning and resigns if leading (listeners hear {@code notLeader}). */
  @Override
  public void close() {
    Leadership l;
    Thread t;
    synchronized (mu) {
      if (state == State.CLOSED) {
        return;
      }
      state = State.CLOSED;
      l = leadership;
      leadership = null;
      t = thread;
      mu.notifyAll();
    }
    if (t != null) {
      t.interrupt();
      try {
        t.join(TimeUnit.SECONDS.toMillis(10));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    if (l != null) {
      try {
        l.resign();
      } finally {
        tell(false);
      }
    }
  }
}

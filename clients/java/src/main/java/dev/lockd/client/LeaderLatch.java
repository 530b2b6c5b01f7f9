package dev.lockd.client;

import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import java.util.logging.Level;

/**
 * A leader election in the shape of Curator's {@code LeaderLatch}: {@link #start()} campaigns in
 * the background (and again after a lost term), {@link #await()} blocks until this participant
 * leads, {@link #hasLeadership()} tells, listeners hear of every change, and {@link #close()}
 * resigns. Unlike Curator's, the leader holds a fencing token ({@link #token()}): fence every
 * side effect of the term with it.
 *
 * <p>A term ends when its lock is lost or when its {@link Leadership} is resigned directly
 * ({@link #leadership()}{@code .get().resign()}): either way {@link #hasLeadership()} turns false
 * at once, listeners hear {@code notLeader}, the latch gives the lock back (a lost hold may still
 * stand on the service, and a new campaign by the same participant would be refused {@code
 * already_held} until it expired) and queues again. {@link #close()} stops campaigning.
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
  /** One campaign: waits in line until this participant leads (tests replace it). */
  volatile Supplier<Leadership> campaigner;

  LeaderLatch(LockdClient client, String name, String id) {
    Names.checkOwner(id);
    this.client = client;
    this.election = new Election(client, name);
    this.id = id;
    this.campaigner = () -> election.campaign(this.id);
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
        l = campaigner.get();
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
      boolean closedMeanwhile;
      synchronized (mu) {
        closedMeanwhile = state != State.STARTED;
        if (!closedMeanwhile) {
          leadership = l;
          mu.notifyAll();
        }
      }
      if (closedMeanwhile) {
        // Won as close() ran: close() did not see this term, so it is given back here, even
        // though close() interrupted this thread.
        Thread.interrupted();
        resignQuietly(l);
        return;
      }
      tell(true);
      try {
        // Lost, or resigned through the Leadership handed out by leadership().
        CompletableFuture.anyOf(l.lostSignal(), l.resigned()).get();
      } catch (InterruptedException e) {
        return; // closed: close() resigns
      } catch (ExecutionException e) {
        // never completes exceptionally
      }
      boolean ours;
      synchronized (mu) {
        ours = leadership == l;
        if (ours) {
          leadership = null;
        }
      }
      if (l.isLost()) {
        Engine.LOG.warning("lockd: leadership of " + election.name() + " lost: "
            + l.lock().lostReason());
      } else {
        Engine.LOG.info("lockd: leadership of " + election.name() + " resigned; campaigning "
            + "again");
      }
      // Give the hold back before queueing again: the service may still count a lost one (and
      // would refuse this participant's next campaign already_held until it expired). A close()
      // that interrupts this thread must not stop the release.
      boolean interrupted = Thread.interrupted();
      resignQuietly(l);
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
      if (ours) {
        tell(false);
      }
    }
  }

  private void resignQuietly(Leadership l) {
    try {
      l.resign();
    } catch (LockdException e) {
      Engine.LOG.log(Level.FINE, "lockd: resigning " + election.name() + " failed", e);
    }
  }

  /** Whether this participant leads now (its lock held: not lost, not resigned). */
  public boolean hasLeadership() {
    Leadership l = leadership;
    return state == State.STARTED && l != null && l.isLeading();
  }

  /** The current term's leadership, while this participant leads. Resigning it ends the term
   * (the latch then campaigns again; close the latch to stop). */
  public Optional<Leadership> leadership() {
    Leadership l = leadership;
    return l != null && l.isLeading() ? Optional.of(l) : Optional.empty();
  }

  /** The current term's fencing token, while this participant leads. */
  public OptionalLong token() {
    Leadership l = leadership;
    return l != null && l.isLeading() ? OptionalLong.of(l.token()) : OptionalLong.empty();
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
    if (t != null && t != Thread.currentThread()) { // a listener may close its own latch
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

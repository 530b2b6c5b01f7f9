package dev.lockd.client;

import java.util.ArrayList;
import java.util.List;
import java.util.logging.Level;
import java.util.logging.Logger;

/** A session's and a hold's lost state, watched by callbacks (as _lease.py's Lease/LockLease). */
final class Leases {
  private Leases() {}

  private static final Logger LOG = Logger.getLogger("dev.lockd.client");

  /** Callbacks called once when the lease they watch is lost. */
  abstract static class Watched {
    volatile boolean lost;
    volatile String why = "";
    private List<Runnable> watchers = new ArrayList<>();
    final Object mu = new Object();

    boolean fire(String reason) {
      List<Runnable> ws;
      synchronized (mu) {
        if (lost) {
          return false;
        }
        why = reason;
        lost = true;
        ws = watchers;
        watchers = new ArrayList<>();
      }
      for (Runnable cb : ws) {
        try {
          cb.run();
        } catch (RuntimeException e) { // a watcher must not stop the others
          LOG.log(Level.WARNING, "lockd lease watcher failed", e);
        }
      }
      return true;
    }

    /** Adds {@code cb}; true if it was added (false: already lost, the caller calls it). */
    boolean add(Runnable cb) {
      synchronized (mu) {
        if (lost) {
          return false;
        }
        watchers.add(cb);
        return true;
      }
    }

    /** Removes {@code cb}; returns whether no watcher is left (null: it was not there). */
    Boolean remove(Runnable cb) {
      synchronized (mu) {
        for (int i = 0; i < watchers.size(); i++) {
          if (watchers.get(i) == cb) {
            watchers.remove(i);
            return watchers.isEmpty();
          }
        }
        return null;
      }
    }

    int watcherCount() {
      synchronized (mu) {
        return watchers.size();
      }
    }
  }

  /** One session as its locks see it: its per-group leases and whether it is lost (final). */
  static final class Lease extends Watched {
    final int gen;
    final String sessionId;
    final GroupLeases leases;

    Lease(int gen, String sessionId, GroupLeases leases) {
      this.gen = gen;
      this.sessionId = sessionId;
      this.leases = leases;
    }

    /** The session's local deadline ({@link GroupLeases#sessionDeadline()}). */
    double deadline() {
      return leases.sessionDeadline();
    }

    /** Lost, or past the local deadline (checked against the clock, so a process resumed after a
     * pause sees it before the engine's timer has run). */
    boolean isLost() {
      return lost || leases.sessionExpired(Clock.now());
    }

    void watch(Runnable cb) {
      if (!add(cb)) {
        cb.run();
      }
    }

    void unwatch(Runnable cb) {
      remove(cb);
    }

    void end(String reason) {
      fire(reason);
    }
  }

  /** One hold's lease: lost when its session is, at its own deadline, or when its group's lease
   * epoch ended. */
  static final class LockLease extends Watched {
    final Lease session;
    final HoldLease hold;
    private final Runnable sessionEnded = () -> fire(sessionWhy());
    /** Whether {@link #sessionEnded} is registered with the session (under {@code mu}). */
    private boolean sessionWatched;

    LockLease(Lease session, HoldLease hold) {
      this.session = session;
      this.hold = hold;
    }

    private String sessionWhy() {
      return session.why;
    }

    /** The lock's local deadline on {@link Clock}. */
    double deadline() {
      return session.leases.lockDeadline(hold);
    }

    int group() {
      return hold.group();
    }

    boolean expired(double now) {
      return now >= deadline();
    }

    /** Lost, its session lost, or past its deadline (against the clock). */
    boolean isLost() {
      return lost || session.lost || expired(Clock.now());
    }

    /**
     * Calls {@code cb} once when the hold is lost (at once if it already is). The first watcher
     * registers the hold with its session (whose end is this hold's end) and the last one's
     * {@link #unwatch} takes it off, both under {@code mu}, so that a watch racing an unwatch
     * never leaves watchers without the session's registration, or a registration twice. The
     * session never holds its own lock while it calls back, so this order (hold, then session)
     * cannot deadlock.
     */
    void watch(Runnable cb) {
      boolean now;
      boolean sessionGone = false;
      synchronized (mu) {
        now = !add(cb);
        if (!now && !sessionWatched) {
          sessionWatched = true;
          sessionGone = !session.add(sessionEnded);
        }
      }
      if (now) {
        cb.run();
      } else if (sessionGone) {
        sessionEnded.run(); // the session already ended: so did this hold
      }
    }

    void unwatch(Runnable cb) {
      synchronized (mu) {
        Boolean last = remove(cb);
        if (last != null && last && sessionWatched) {
          sessionWatched = false;
          session.remove(sessionEnded);
        }
      }
    }

    void end(String reason) {
      if (fire(reason)) {
        synchronized (mu) {
          if (sessionWatched) {
            sessionWatched = false;
            session.remove(sessionEnded);
          }
        }
      }
    }

    /** Whether the session has this hold's end registered (tests). */
    boolean watchesSession() {
      synchronized (mu) {
        return sessionWatched;
      }
    }
  }
}

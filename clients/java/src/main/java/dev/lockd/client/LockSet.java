package dev.lockd.client;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** Locks taken together by {@link LockdClient#acquireAll}, in sorted name order. */
public final class LockSet implements AutoCloseable {
  private final List<Lock> locks;

  LockSet(List<Lock> locks) {
    this.locks = Collections.unmodifiableList(new ArrayList<>(locks));
  }

  /** The locks, in the sorted order they were taken. */
  public List<Lock> locks() {
    return locks;
  }

  /** Name to fencing token. */
  public Map<String, Long> tokens() {
    Map<String, Long> m = new LinkedHashMap<>();
    for (Lock l : locks) {
      m.put(l.name(), l.token());
    }
    return m;
  }

  public Lock get(String name) {
    for (Lock l : locks) {
      if (l.name().equals(name)) {
        return l;
      }
    }
    throw new IllegalArgumentException("no lock named '" + name + "' in the set");
  }

  public boolean isLost() {
    return locks.stream().anyMatch(Lock::isLost);
  }

  /** Releases every lock, last taken first; throws the first failure after trying all. */
  public void release() {
    LockdException first = null;
    for (int i = locks.size() - 1; i >= 0; i--) {
      try {
        locks.get(i).release();
      } catch (LockdException e) {
        first = first == null ? e : first;
      }
    }
    if (first != null) {
      throw first;
    }
  }

  /** Releases every lock; throws {@link LockLostException} if one was lost before. */
  @Override
  public void close() {
    boolean lost = isLost();
    try {
      release();
    } catch (LockdException e) {
      LockLostException lle = new LockLostException(
          "a lock of the set was lost before it was closed");
      lle.initCause(e);
      throw lle;
    }
    if (lost) {
      throw new LockLostException("a lock of the set was lost before it was closed");
    }
  }
}

package dev.lockd.client;

import dev.lockd.v1.OpenSessionResponse;
import dev.lockd.v1.ReleaseRequest;
import dev.lockd.v1.SessionEnded;
import dev.lockd.v1.SessionEvent;
import dev.lockd.v1.SessionRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/** A client with no service behind it, for unit tests: its session opened by a synthetic answer,
 * its unary releases answered by a hook, its stream (if any) a fake the test reads and answers. */
final class Synthetic {
  private Synthetic() {}

  /**
   * A client whose session "s" was opened now (TTL 15 s, no keepalive due for ages) and whose
   * unary releases land in {@code released}. Like grpc-java's blocking stubs, the release hook
   * fails a call made on an interrupted thread (CANCELLED).
   */
  static LockdClient client(List<ReleaseRequest> released, int attempts) {
    LockdClient c = new LockdClient(new Options(List.of("127.0.0.1:1"), "me", 15, null, "", null,
        2, 5, new RetryPolicy(attempts, Duration.ofMillis(10), Duration.ofMillis(20)), null,
        null, null, null));
    c.engine.reportHook = names -> { };
    c.engine.releaseHook = req -> {
      if (Thread.currentThread().isInterrupted()) {
        throw new StatusRuntimeException(Status.CANCELLED.withDescription("Thread interrupted"));
      }
      released.add(req);
      return 0;
    };
    c.engine.openSynthetic(OpenSessionResponse.newBuilder().setSessionId("s").setTtlMs(15_000)
        .setKeepaliveEveryMs(1_000_000_000L).build(), Clock.now());
    return c;
  }

  static List<ReleaseRequest> releases() {
    return Collections.synchronizedList(new ArrayList<>());
  }

  /** A lock of the synthetic session granted now in {@code group}. */
  static Lock lock(LockdClient c, String name, long token, int group) {
    return new Lock(c, c.engine.holdForTest(name, token, Clock.now(), group, 0));
  }

  /** The service's push: the session's lease in {@code group} ended (the session goes on). */
  static SessionEvent groupEnded(int group) {
    return SessionEvent.newBuilder().setSessionEnded(SessionEnded.newBuilder().setGroup(group)
        .setReason("expired")).build();
  }

  /** The client side of a session stream: what the engine sends lands in {@link #sent}. */
  static final class FakeStream extends ClientCallStreamObserver<SessionRequest> {
    final List<SessionRequest> sent = Collections.synchronizedList(new ArrayList<>());
    volatile boolean cancelled;

    @Override
    public void cancel(String message, Throwable cause) {
      cancelled = true;
    }

    @Override
    public boolean isReady() {
      return true;
    }

    @Override
    public void setOnReadyHandler(Runnable r) { }

    @Override
    public void disableAutoInboundFlowControl() { }

    @Override
    public void request(int n) { }

    @Override
    public void setMessageCompression(boolean enable) { }

    @Override
    public void onNext(SessionRequest r) {
      sent.add(r);
    }

    @Override
    public void onError(Throwable t) {
      cancelled = true;
    }

    @Override
    public void onCompleted() { }

    /** The first request sent that {@code kind} matches, waiting up to 5 s for it. */
    SessionRequest await(java.util.function.Predicate<SessionRequest> kind) {
      double end = Clock.now() + 5;
      while (Clock.now() < end) {
        synchronized (sent) {
          for (SessionRequest r : sent) {
            if (kind.test(r)) {
              return r;
            }
          }
        }
        Engine.sleep(0.005);
      }
      throw new AssertionError("nothing of that kind was sent: " + sent);
    }
  }

  /** Gives the client's session a stream whose requests the test sees (and answers with {@link
   * Engine#injectEvent}). */
  static FakeStream attach(Engine core) {
    FakeStream f = new FakeStream();
    Engine.Conn c = core.new Conn(0, 0);
    c.beforeStart(f);
    core.attachForTest(c);
    return f;
  }
}

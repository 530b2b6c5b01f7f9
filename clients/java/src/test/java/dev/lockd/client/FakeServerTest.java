package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.v1.CloseSessionRequest;
import dev.lockd.v1.CloseSessionResponse;
import dev.lockd.v1.LockGrpc;
import dev.lockd.v1.OpenSessionResponse;
import dev.lockd.v1.SessionEvent;
import dev.lockd.v1.SessionRequest;
import dev.lockd.v1.WatchRequest;
import io.grpc.Grpc;
import io.grpc.InsecureServerCredentials;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerInterceptors;
import io.grpc.Status;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The client against a fake lockd (a gRPC server in the test, on a port of the Java suite's
 * range) that answers late, or in ways a real node rarely does. */
class FakeServerTest {
  static final int PORT = 19850;
  static final String ENDPOINT = "127.0.0.1:" + PORT;

  static Server server;
  static final ScheduledExecutorService later = Executors.newSingleThreadScheduledExecutor(r -> {
    Thread t = new Thread(r, "fake-lockd-later");
    t.setDaemon(true);
    return t;
  });
  static final List<String> closedSessions = new CopyOnWriteArrayList<>();
  static volatile CountDownLatch watchCancelled = new CountDownLatch(1);
  static volatile CountDownLatch openSeen = new CountDownLatch(1);
  static volatile CountDownLatch watchSeen = new CountDownLatch(1);

  /** Opens sessions 500 ms late; watches send their headers (with a first event) 500 ms late. */
  static final class Fake extends LockGrpc.LockImplBase {
    @Override
    public StreamObserver<SessionRequest> session(StreamObserver<SessionEvent> out) {
      return new StreamObserver<>() {
        @Override
        public void onNext(SessionRequest r) {
          if (r.hasOpen()) {
            openSeen.countDown();
            later.schedule(() -> {
              try {
                out.onNext(SessionEvent.newBuilder().setRequestId(r.getRequestId())
                    .setOpened(OpenSessionResponse.newBuilder().setSessionId("late")
                        .setTtlMs(15_000).setKeepaliveEveryMs(5_000)).build());
              } catch (RuntimeException ignored) {
                // the client cancelled
              }
            }, 500, TimeUnit.MILLISECONDS);
          }
        }

        @Override
        public void onError(Throwable t) { }

        @Override
        public void onCompleted() {
          out.onCompleted();
        }
      };
    }

    @Override
    public void closeSession(CloseSessionRequest r, StreamObserver<CloseSessionResponse> out) {
      closedSessions.add(r.getSessionId());
      out.onNext(CloseSessionResponse.getDefaultInstance());
      out.onCompleted();
    }

    @Override
    public void watch(WatchRequest r, StreamObserver<dev.lockd.v1.WatchEvent> out) {
      CountDownLatch cancelled = watchCancelled;
      ((ServerCallStreamObserver<dev.lockd.v1.WatchEvent>) out).setOnCancelHandler(
          cancelled::countDown);
      watchSeen.countDown();
      later.schedule(() -> {
        try {
          out.onNext(dev.lockd.v1.WatchEvent.getDefaultInstance());
        } catch (RuntimeException ignored) {
          // the client cancelled
        }
      }, 500, TimeUnit.MILLISECONDS);
    }
  }

  /** CheckToken refused with the service's code in the initial metadata, none in the trailers. */
  static final ServerInterceptor CODE_IN_HEADERS = new ServerInterceptor() {
    @Override
    public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
        ServerCallHandler<Q, R> next) {
      if (!"CheckToken".equals(call.getMethodDescriptor().getBareMethodName())) {
        return next.startCall(call, headers);
      }
      Metadata md = new Metadata();
      md.put(Errors.ERROR_CODE, "stale_token");
      call.sendHeaders(md);
      call.close(Status.FAILED_PRECONDITION.withDescription("a newer token holds it"),
          new Metadata());
      return new ServerCall.Listener<>() { };
    }
  };

  @BeforeAll
  static void start() throws Exception {
    server = Grpc.newServerBuilderForPort(PORT, InsecureServerCredentials.create())
        .addService(ServerInterceptors.intercept(new Fake(), CODE_IN_HEADERS)).build().start();
  }

  @AfterAll
  static void stop() throws Exception {
    server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    later.shutdownNow();
  }

  static LockdClient client() {
    return LockdClient.builder(ENDPOINT).clientName("fake-test")
        .retry(new RetryPolicy(2, Duration.ofMillis(10), Duration.ofMillis(20))).build();
  }

  @Test
  void anOpenInterruptedMidHandshakeClosesTheSessionItStillOpens() throws Exception {
    closedSessions.clear();
    openSeen = new CountDownLatch(1);
    try (LockdClient c = client()) {
      CompletableFuture<Throwable> thrown = new CompletableFuture<>();
      Thread t = new Thread(() -> {
        try {
          c.connect();
          thrown.complete(null);
        } catch (RuntimeException e) {
          thrown.complete(e);
        }
      });
      t.start();
      assertTrue(openSeen.await(5, TimeUnit.SECONDS)); // the open is out; its answer comes later
      t.interrupt();
      assertInstanceOf(ClientClosedException.class, thrown.get(5, TimeUnit.SECONDS));
      ClientUnitTest.waitFor(() -> closedSessions.contains("late"), 5);
      assertEquals(List.of("late"), closedSessions, "the session opened for nobody is closed");
      assertTrue(c.sessionId().isEmpty());
    }
  }

  @Test
  void aWatchClosedWhileItOpensCancelsItsStream() throws Exception {
    watchCancelled = new CountDownLatch(1);
    watchSeen = new CountDownLatch(1);
    try (LockdClient c = client()) {
      Watch w = c.watch("jobs/a");
      CompletableFuture<Throwable> thrown = new CompletableFuture<>();
      Thread t = new Thread(() -> {
        try {
          w.open();
          thrown.complete(null);
        } catch (RuntimeException e) {
          thrown.complete(e);
        }
      });
      t.start();
      assertTrue(watchSeen.await(5, TimeUnit.SECONDS)); // open() waits for the late headers
      w.close();
      assertInstanceOf(ClientClosedException.class, thrown.get(5, TimeUnit.SECONDS));
      assertTrue(watchCancelled.await(5, TimeUnit.SECONDS), "the stream is not left open");
    }
  }

  @Test
  void theServicesCodeInTheInitialMetadataTypesTheError() {
    try (LockdClient c = client()) {
      ConflictException e = assertThrows(ConflictException.class, () -> c.checkToken("x", 1));
      assertEquals("stale_token", e.code());
    }
  }
}

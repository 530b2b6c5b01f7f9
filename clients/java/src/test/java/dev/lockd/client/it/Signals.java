package dev.lockd.client.it;

import java.io.IOException;
import java.util.concurrent.TimeUnit;

/** Signals to a process by its PID ({@code kill -SIG PID}: Java has no SIGSTOP of its own). */
public final class Signals {
  private Signals() {}

  public static void send(long pid, String signal) {
    try {
      Process p = new ProcessBuilder("kill", "-" + signal, Long.toString(pid))
          .redirectErrorStream(true).start();
      p.getInputStream().readAllBytes();
      if (!p.waitFor(5, TimeUnit.SECONDS)) {
        p.destroyForcibly();
      }
    } catch (IOException e) {
      throw new IllegalStateException("kill -" + signal + " " + pid, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}

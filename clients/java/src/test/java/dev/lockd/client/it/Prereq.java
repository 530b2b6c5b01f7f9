package dev.lockd.client.it;

import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.Assumptions;

/** A missing prerequisite skips a test locally and fails it under CI (it must not vanish in
 * silence). */
public final class Prereq {
  private Prereq() {}

  public static RuntimeException missing(String what) {
    if (System.getenv("CI") != null && !System.getenv("CI").isEmpty()) {
      Assertions.fail("missing prerequisite under CI: " + what);
    }
    Assumptions.abort("missing prerequisite: " + what);
    return new IllegalStateException("unreachable");
  }

  /** The repository's root. */
  public static Path repo() {
    return Path.of(System.getProperty("lockd.repo", "../..")).toAbsolutePath().normalize();
  }

  /** The lockd binary: -Dlockd.bin, else LOCKD_BIN, else target/debug/lockd. */
  public static Path lockdBin() {
    String p = System.getProperty("lockd.bin");
    if (p == null || p.isBlank() || p.startsWith("${")) {
      p = System.getenv("LOCKD_BIN");
    }
    Path bin = p == null || p.isBlank() ? repo().resolve("target/debug/lockd") : Path.of(p);
    if (!Files.isExecutable(bin)) {
      throw missing("lockd binary " + bin + " (build it: cargo build -p lockd-server --bin lockd,"
          + " or set LOCKD_BIN)");
    }
    return bin;
  }

  /** The PostgreSQL connection string (LOCKD_CHECK_PG, libpq key=value form) as a JDBC URL. */
  public static String jdbcUrl() {
    String dsn = System.getenv("LOCKD_CHECK_PG");
    if (dsn == null || dsn.isBlank()) {
      throw missing("PostgreSQL: set LOCKD_CHECK_PG (scripts/ci-postgres.sh prints one)");
    }
    return toJdbc(dsn);
  }

  /** {@code host=H port=P user=U dbname=D [password=X]} (or a postgresql:// URL) as JDBC. */
  static String toJdbc(String dsn) {
    if (dsn.startsWith("jdbc:")) {
      return dsn;
    }
    if (dsn.startsWith("postgres://") || dsn.startsWith("postgresql://")) {
      return "jdbc:" + dsn.replaceFirst("^postgres://", "postgresql://");
    }
    String host = "127.0.0.1";
    String port = "5432";
    String db = "postgres";
    StringBuilder params = new StringBuilder();
    for (String kv : dsn.trim().split("\\s+")) {
      int eq = kv.indexOf('=');
      if (eq < 0) {
        continue;
      }
      String k = kv.substring(0, eq);
      String v = kv.substring(eq + 1);
      switch (k) {
        case "host" -> host = v;
        case "port" -> port = v;
        case "dbname" -> db = v;
        case "user" -> params.append(params.length() == 0 ? "?" : "&").append("user=").append(v);
        case "password" -> params.append(params.length() == 0 ? "?" : "&").append("password=")
            .append(v);
        default -> { }
      }
    }
    return "jdbc:postgresql://" + host + ":" + port + "/" + db + params;
  }
}

package dev.lockd.client;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * Fenced writes over JDBC (PostgreSQL 9.5 or later: {@link #fencedWrite} is one {@code INSERT ...
 * ON CONFLICT DO UPDATE ... WHERE} statement). A lease can run out under a paused process, so a
 * lock alone cannot stop a stale holder from writing. The store must refuse writes that carry a
 * token older than one it has accepted:
 *
 * <pre>
 * UPDATE t SET value = ?, fence = ? WHERE key = ? AND fence &lt;= ?
 * -- 0 rows: a newer holder exists; stop.
 * </pre>
 *
 * <p>The helpers work in the caller's transaction and never commit (commit yourself, or use an
 * auto-commit connection). The row lock the {@code UPDATE} takes is held to the commit, so a
 * newer holder's write waits for it and then passes its own check. The same helpers as the
 * Python client's {@code lockd_client.fencing}.
 */
public final class Fencing {
  private Fencing() {}

  /** Fencing tokens are stored in a BIGINT; the service never mints one above this. */
  public static final long MAX_TOKEN = Long.MAX_VALUE;
  public static final String DEFAULT_TABLE = "lockd_fenced";

  /** The key-value table {@link #fencedWrite} uses ({@code %s} is the table's quoted name). */
  public static final String SCHEMA = "CREATE TABLE IF NOT EXISTS %s (\n"
      + "    key   TEXT PRIMARY KEY,\n"
      + "    value TEXT NOT NULL,\n"
      + "    fence BIGINT NOT NULL DEFAULT 0 CHECK (fence >= 0)\n"
      + ")";

  /** {@code name} or {@code schema.name} as quoted identifiers. */
  static String ident(String name) {
    String[] parts = name == null ? new String[0] : name.split("\\.", -1);
    if (parts.length < 1 || parts.length > 2) {
      throw new InvalidArgumentException("table must be 'name' or 'schema.name' (got '" + name
          + "')");
    }
    List<String> out = new ArrayList<>();
    for (String p : parts) {
      out.add(column(p));
    }
    return String.join(".", out);
  }

  static String column(String c) {
    if (c == null || c.isEmpty() || c.indexOf('\0') >= 0) {
      throw new InvalidArgumentException("an identifier must be non-empty (got '" + c + "')");
    }
    return "\"" + c.replace("\"", "\"\"") + "\"";
  }

  static void checkToken(long token) {
    if (token <= 0) {
      throw new InvalidArgumentException(
          "token must lie in 1..=" + MAX_TOKEN + " to fit a BIGINT fence (got " + token + ")");
    }
  }

  /** Creates the fenced key-value table (idempotent). */
  public static void createTable(Connection conn, String table) throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.execute(String.format(SCHEMA, ident(table)));
    }
  }

  /** {@link #createTable(Connection, String)} of {@link #DEFAULT_TABLE}. */
  public static void createTable(Connection conn) throws SQLException {
    createTable(conn, DEFAULT_TABLE);
  }

  /** Adds a {@code fence BIGINT NOT NULL DEFAULT 0} column to a table of yours (idempotent). */
  public static void addFenceColumn(Connection conn, String table, String column)
      throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.execute("ALTER TABLE " + ident(table) + " ADD COLUMN IF NOT EXISTS " + column(column)
          + " BIGINT NOT NULL DEFAULT 0");
    }
  }

  /**
   * {@code UPDATE table SET <values>, fence = token WHERE <key> AND fence <= token}. Returns true
   * if the row was written, false if it was refused (a newer token is stored) or does not exist.
   * Example: {@code fencedUpdate(conn, "payout_batches", Map.of("status", "sent"),
   * Map.of("batch_id", 2210), lk.token(), "fence")}.
   */
  public static boolean fencedUpdate(Connection conn, String table, Map<String, ?> values,
      Map<String, ?> key, long token, String fenceColumn) throws SQLException {
    checkToken(token);
    if (values.isEmpty()) {
      throw new InvalidArgumentException("values must name at least one column to set");
    }
    if (key.isEmpty()) {
      throw new InvalidArgumentException("key must name at least one column to match");
    }
    if (values.containsKey(fenceColumn) || key.containsKey(fenceColumn)) {
      throw new InvalidArgumentException("the fence column '" + fenceColumn + "' is set from the "
          + "token; leave it out of values and key");
    }
    List<String> sets = new ArrayList<>();
    List<Object> params = new ArrayList<>();
    for (Map.Entry<String, ?> e : values.entrySet()) {
      sets.add(column(e.getKey()) + " = ?");
      params.add(e.getValue());
    }
    String f = column(fenceColumn);
    params.add(token);
    List<String> where = new ArrayList<>();
    for (Map.Entry<String, ?> e : key.entrySet()) {
      where.add(column(e.getKey()) + " = ?");
      params.add(e.getValue());
    }
    params.add(token);
    String sql = "UPDATE " + ident(table) + " SET " + String.join(", ", sets) + ", " + f
        + " = ? WHERE " + String.join(" AND ", where) + " AND " + f + " <= ?";
    try (PreparedStatement ps = conn.prepareStatement(sql)) {
      for (int i = 0; i < params.size(); i++) {
        ps.setObject(i + 1, params.get(i));
      }
      return ps.executeUpdate() == 1;
    }
  }

  /** The one statement of {@link #fencedWrite} ({@code %s} is the table's quoted name): insert
   * the key, or update it if the stored fence is not newer than the token. */
  static final String UPSERT = "INSERT INTO %s AS cur (key, value, fence) VALUES (?, ?, ?) "
      + "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence "
      + "WHERE cur.fence <= EXCLUDED.fence";

  /**
   * Sets {@code key} to {@code value} in the fenced key-value table if {@code token} is at least
   * the key's fence, inserting the key if it is new, in one statement (the same as the Python
   * client's): {@code INSERT ... ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence =
   * EXCLUDED.fence WHERE cur.fence <= EXCLUDED.fence}. Returns whether the write was accepted
   * (one row inserted or updated; none: a newer token is stored).
   */
  public static boolean fencedWrite(Connection conn, String table, String key, String value,
      long token) throws SQLException {
    checkToken(token);
    try (PreparedStatement ps = conn.prepareStatement(String.format(UPSERT, ident(table)))) {
      ps.setString(1, key);
      ps.setString(2, value);
      ps.setLong(3, token);
      return ps.executeUpdate() == 1;
    }
  }

  /** {@link #fencedWrite(Connection, String, String, String, long)} on {@link #DEFAULT_TABLE}. */
  public static boolean fencedWrite(Connection conn, String key, String value, long token)
      throws SQLException {
    return fencedWrite(conn, DEFAULT_TABLE, key, value, token);
  }

  /**
   * {@link #fencedWrite} under {@code lock}: throws {@link LockLostException} without writing
   * once the lock is lost, and {@link FenceRejectedException} when the store has seen a newer
   * token (reported to the service through {@code client}, if given, so that lockd counts it).
   */
  public static void write(Connection conn, Lock lock, String table, String key, String value,
      LockdClient client) throws SQLException {
    if (lock.isLost()) {
      throw new LockLostException("the lock '" + lock.name() + "' is lost; not writing '" + key
          + "'");
    }
    if (!fencedWrite(conn, table, key, value, lock.token())) {
      if (client != null) {
        client.reportFencingRejected(lock.name());
      }
      throw new FenceRejectedException("the store refused token " + lock.token() + " for '" + key
          + "': a newer holder of '" + lock.name() + "' has written");
    }
  }

  /** {@link #write(Connection, Lock, String, String, String, LockdClient)} on {@link
   * #DEFAULT_TABLE}, without reporting. */
  public static void write(Connection conn, Lock lock, String key, String value)
      throws SQLException {
    write(conn, lock, DEFAULT_TABLE, key, value, null);
  }
}

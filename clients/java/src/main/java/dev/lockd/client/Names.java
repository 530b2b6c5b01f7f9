package dev.lockd.client;

/** The service's input rules, checked before anything is sent. */
final class Names {
  private Names() {}

  static final int MAX_NAME_BYTES = 512;
  static final int MAX_OWNER_BYTES = 256;
  static final int MAX_SEMAPHORE = 10_000;

  /**
   * Characters a lock name may not hold, as the server's rule (lockd_core::limits::is_invisible)
   * and docs/openapi.yaml's Name pattern have them: controls, then invisible and bidi-control
   * ones.
   */
  static final int[][] NOT_IN_NAMES = {
      {0x00, 0x1F}, {0x7F, 0x9F}, {0xAD, 0xAD}, {0x34F, 0x34F}, {0x600, 0x605}, {0x61C, 0x61C},
      {0x6DD, 0x6DD}, {0x70F, 0x70F}, {0x890, 0x891}, {0x8E2, 0x8E2}, {0x115F, 0x1160},
      {0x17B4, 0x17B5}, {0x180B, 0x180F}, {0x200B, 0x200F}, {0x2028, 0x202E}, {0x2060, 0x206F},
      {0x3164, 0x3164}, {0xFE00, 0xFE0F}, {0xFEFF, 0xFEFF}, {0xFFA0, 0xFFA0}, {0xFFF9, 0xFFFB},
      {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3},
      {0x1D173, 0x1D17A}, {0xE0000, 0xE0FFF},
  };

  /** UTF-8 length, counting an unpaired surrogate as the 3 bytes it would take. */
  static int utf8Length(String s) {
    int n = 0;
    for (int i = 0; i < s.length();) {
      int c = s.codePointAt(i);
      i += Character.charCount(c);
      n += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    }
    return n;
  }

  private static String head(String s) {
    String h = s.length() > 40 ? s.substring(0, 40) : s;
    StringBuilder sb = new StringBuilder("'");
    h.codePoints().forEach(c -> {
      if (c < 0x20 || (c >= 0x7F && c <= 0x9F) || (c >= 0xD800 && c <= 0xDFFF)) {
        sb.append(String.format("\\u%04x", c));
      } else {
        sb.appendCodePoint(c);
      }
    });
    return sb.append("'").toString();
  }

  /** The server's name rule, so a bad name fails before any call. Names are compared as bytes
   * and never normalised: send NFC so that names which look alike are alike. */
  static void checkName(String name) {
    if (name == null) {
      throw new InvalidArgumentException("lock name must be given (got null)");
    }
    int n = utf8Length(name);
    if (n < 1 || n > MAX_NAME_BYTES) {
      throw new InvalidArgumentException("lock name must be 1..=" + MAX_NAME_BYTES
          + " bytes of UTF-8 (got " + n + " bytes: " + head(name) + ")");
    }
    for (int i = 0; i < name.length();) {
      int c = name.codePointAt(i);
      i += Character.charCount(c);
      if (c >= 0xD800 && c <= 0xDFFF) {
        throw new InvalidArgumentException(String.format(
            "lock name holds an unpaired surrogate U+%04X: %s", c, head(name)));
      }
      for (int[] r : NOT_IN_NAMES) {
        if (c >= r[0] && c <= r[1]) {
          throw new InvalidArgumentException(String.format(
              "lock name holds U+%04X, a control, invisible or bidirectional-control character: %s",
              c, head(name)));
        }
      }
    }
  }

  static void checkOwner(String owner) {
    int n = utf8Length(owner);
    if (n > MAX_OWNER_BYTES) {
      throw new InvalidArgumentException(
          "owner must be at most " + MAX_OWNER_BYTES + " bytes (got " + n + ")");
    }
  }

  /** The limit to send for {@code mode} (0 unless a semaphore). */
  static int checkModeAndLimit(Mode mode, Integer limit) {
    if (mode == null) {
      throw new InvalidArgumentException(
          "mode must be one of EXCLUSIVE, SHARED, SEMAPHORE (got null)");
    }
    if (mode == Mode.SEMAPHORE) {
      if (limit == null || limit < 1 || limit > MAX_SEMAPHORE) {
        throw new InvalidArgumentException("limit must lie in 1..=" + MAX_SEMAPHORE
            + " for a semaphore (got " + limit + ")");
      }
      return limit;
    }
    if (limit != null) {
      throw new InvalidArgumentException("limit is only for mode SEMAPHORE (got limit=" + limit
          + " with mode " + mode + ")");
    }
    return 0;
  }
}

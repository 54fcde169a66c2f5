package io.gpumemd.server.books;

import io.gpumemd.server.error.InvalidRequestException;
import java.security.NoSuchAlgorithmException;
import java.security.SecureRandom;
import java.util.HexFormat;

/**
 * Unguessable identifiers for sessions and leases: 128 bits from a {@link SecureRandom},
 * written as 32 lowercase hex characters. A session id is a bearer credential (whoever has it
 * can release its leases), so ids must not be predictable from earlier ones.
 *
 * <p>Thread-safe: one DRBG per thread, so generation takes no shared lock.
 */
public final class SecureIds {
  public static final int LENGTH = 32;
  private static final HexFormat HEX = HexFormat.of();
  private static final ThreadLocal<SecureRandom> RANDOM = ThreadLocal.withInitial(SecureIds::newRandom);

  private SecureIds() {}

  private static SecureRandom newRandom() {
    try {
      return SecureRandom.getInstance("DRBG");
    } catch (NoSuchAlgorithmException e) {
      return new SecureRandom();
    }
  }

  public static String next() {
    byte[] bytes = new byte[LENGTH / 2];
    RANDOM.get().nextBytes(bytes);
    return HEX.formatHex(bytes);
  }

  /**
   * Checks the form of an id from a request.
   *
   * @throws InvalidRequestException naming the field when it is not 32 lowercase hex digits
   */
  public static String check(String field, String id) {
    if (!isWellFormed(id)) {
      throw malformed(field, id);
    }
    return id;
  }

  /**
   * Checks the form of a secret from a request (a share token) without echoing it: an error
   * message may be logged by the client, and a token off by one character is still a secret.
   *
   * @throws InvalidRequestException naming the field and the length only
   */
  public static String checkSecret(String field, String secret) {
    if (!isWellFormed(secret)) {
      throw InvalidRequestException.of(field, secret.isEmpty() ? "(empty)" : "a value of " + secret.length()
          + " characters (not shown: it may be a secret)", LENGTH + " lowercase hex characters");
    }
    return secret;
  }

  /** True for 32 lowercase hex digits. */
  public static boolean isWellFormed(String id) {
    if (id == null || id.length() != LENGTH) {
      return false;
    }
    for (int i = 0; i < LENGTH; i++) {
      char c = id.charAt(i);
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
        return false;
      }
    }
    return true;
  }

  private static InvalidRequestException malformed(String field, String id) {
    String shown = id == null || id.isEmpty() ? "(empty)"
        : "'" + (id.length() > 40 ? id.substring(0, 40) + "…" : id) + "'";
    return InvalidRequestException.of(field, shown, LENGTH + " lowercase hex characters");
  }
}

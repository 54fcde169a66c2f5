package io.gpumemd.server.grpc;

import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.sharing.PublishedObject;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.sharing.ShareToken;
import io.gpumemd.server.sharing.ShareCursor;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

/**
 * Page sizes and page tokens of ListSessions, ListLeases, ListObjects and ListShares. A token is the last
 * item's sort key (a lease's grant sequence; a session's open time and id; a share token's tenant, age
 * and public id, never the token itself), base64url-encoded with a kind
 * prefix so that one listing's token is refused by the other. It carries no secret: a caller
 * who forges one only skips ahead in a listing that shows it nothing it may not see anyway.
 * Stateless.
 */
final class PageTokens {
  static final int DEFAULT_PAGE_SIZE = 1000;
  /**
   * At most about 2 MB of SessionInfo or LeaseInfo even with 128-character names and tags
   * (about 370 bytes each): well within any gRPC client's 4 MiB inbound default.
   */
  static final int MAX_PAGE_SIZE = 5000;
  private static final String EXPECTED = "empty, or the next_page_token of the previous page of this listing";

  private PageTokens() {}

  /** The page size asked for: 0 takes the default, more than the maximum is lowered to it. */
  static int pageSize(String field, int asked) {
    if (asked < 0) {
      throw InvalidRequestException.of(field, asked, "0 (= " + DEFAULT_PAGE_SIZE + ") or more; at most "
          + MAX_PAGE_SIZE + " are returned");
    }
    return asked == 0 ? DEFAULT_PAGE_SIZE : Math.min(asked, MAX_PAGE_SIZE);
  }

  static String leaseToken(LeaseRecord last) {
    return encode("l:" + last.sequence());
  }

  /** The grant sequence after which the page starts; 0 for the first page. */
  static long leaseCursor(String token) {
    if (token.isEmpty()) {
      return 0;
    }
    String key = decode(token);
    try {
      if (key.startsWith("l:")) {
        long sequence = Long.parseLong(key.substring(2));
        if (sequence > 0) {
          return sequence;
        }
      }
    } catch (NumberFormatException e) {
      // refused below
    }
    throw invalid(token);
  }

  static String sessionToken(Session last) {
    return encode("s:" + last.openedNanos() + ":" + last.id());
  }

  /** {openedNanos, id} after which the page starts; null for the first page. */
  static Object[] sessionCursor(String token) {
    if (token.isEmpty()) {
      return null;
    }
    String key = decode(token);
    int colon = key.indexOf(':', 2);
    if (key.startsWith("s:") && colon > 2) {
      try {
        return new Object[] {Long.parseLong(key.substring(2, colon)), key.substring(colon + 1)};
      } catch (NumberFormatException e) {
        // refused below
      }
    }
    throw invalid(token);
  }

  static String objectToken(PublishedObject last) {
    return encode("o:" + last.tenant() + "\n" + last.name());
  }

  /** {tenant, name} after which the page starts; null for the first page. */
  static String[] objectCursor(String token) {
    if (token.isEmpty()) {
      return null;
    }
    String key = decode(token);
    int newline = key.indexOf('\n');
    if (key.startsWith("o:") && newline > 2) {
      return new String[] {key.substring(2, newline), key.substring(newline + 1)};
    }
    throw invalid(token);
  }

  static String shareToken(ShareToken last) {
    return encode("h:" + last.tenant() + "\n" + last.createdNanos() + "\n" + last.id());
  }

  /** The share token after which the page starts; null for the first page. */
  static ShareCursor shareCursor(String token) {
    if (token.isEmpty()) {
      return null;
    }
    String key = decode(token);
    // From the end: a tenant's name is the one part that could hold anything.
    int idAt = key.lastIndexOf('\n');
    int nanosAt = idAt > 0 ? key.lastIndexOf('\n', idAt - 1) : -1;
    if (key.startsWith("h:") && nanosAt >= 2) {
      try {
        return new ShareCursor(key.substring(2, nanosAt), Long.parseLong(key.substring(nanosAt + 1, idAt)),
            key.substring(idAt + 1));
      } catch (NumberFormatException e) {
        // refused below
      }
    }
    throw invalid(token);
  }

  private static String encode(String key) {
    return Base64.getUrlEncoder().withoutPadding().encodeToString(key.getBytes(StandardCharsets.UTF_8));
  }

  private static String decode(String token) {
    if (token.length() > 800) {
      throw invalid(token.substring(0, 40) + "...");
    }
    try {
      return new String(Base64.getUrlDecoder().decode(token), StandardCharsets.UTF_8);
    } catch (IllegalArgumentException e) {
      throw invalid(token);
    }
  }

  private static InvalidRequestException invalid(String token) {
    return InvalidRequestException.of("page_token", "'" + token + "'", EXPECTED);
  }
}

package io.gpumemd.server.sharing;

import io.gpumemd.server.books.SharedBlock;
import io.gpumemd.server.error.InvalidRequestException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A shared block published under a name of its tenant. The name is a hold on the block until
 * it is unpublished. Immutable but for the lookup counter.
 *
 * @param publishedBy the publishing session, as listings show it
 */
public record PublishedObject(String tenant, String name, SharedBlock shared, boolean readOnly, long publishedNanos,
    String publishedBy, AtomicLong lookups) {
  /** Longest object name, in characters. */
  public static final int MAX_NAME_LENGTH = 256;

  /**
   * An object name: 1 to 256 characters (code points), printable, without leading or trailing
   * white space. Control and format characters (right-to-left overrides, zero-width spaces),
   * line and paragraph separators and lone surrogates are refused: a name is shown in
   * line-based listings, where they would break or spoof the lines.
   */
  static String checkName(String name) {
    int length = name.codePointCount(0, name.length());
    if (length == 0) {
      throw InvalidRequestException.of("name", "''", "1 to " + MAX_NAME_LENGTH + " characters");
    }
    if (length > MAX_NAME_LENGTH) {
      throw InvalidRequestException.of("name", length + " characters", "at most " + MAX_NAME_LENGTH);
    }
    int index = 0;
    for (int i = 0; i < name.length(); index++) {
      int c = name.codePointAt(i);
      int type = Character.getType(c);
      if (type == Character.CONTROL || type == Character.FORMAT || type == Character.LINE_SEPARATOR
          || type == Character.PARAGRAPH_SEPARATOR || type == Character.SURROGATE || type == Character.UNASSIGNED) {
        throw InvalidRequestException.of("name", String.format("U+%04X at index %d", c, index),
            "printable text (no control, format or separator characters)");
      }
      i += Character.charCount(c);
    }
    if (Character.isWhitespace(name.codePointAt(0)) || Character.isWhitespace(name.codePointBefore(name.length()))
        || Character.isSpaceChar(name.codePointAt(0)) || Character.isSpaceChar(name.codePointBefore(name.length()))) {
      throw InvalidRequestException.of("name", "'" + name + "'", "no leading or trailing white space");
    }
    return name;
  }


  /** The key of the name table: names are unique per tenant (and never hold a line feed). */
  public static String key(String tenant, String name) {
    return tenant + "\n" + name;
  }
}

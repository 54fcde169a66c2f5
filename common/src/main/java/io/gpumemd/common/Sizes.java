package io.gpumemd.common;

import java.util.Locale;

/**
 * Byte sizes and durations as people write and read them. Parses {@code 4096}, {@code 512KiB},
 * {@code 64MiB}, {@code 8GiB}, {@code 2g} (every suffix binary: K = KiB = 1024) and formats
 * {@code 67108864} as {@code 64.0 MiB}. The one size parser of the daemon's flags and
 * gpumemctl's. Stateless and thread-safe.
 */
public final class Sizes {
  private static final String[] UNITS = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};

  private Sizes() {}

  /**
   * Parses a byte size.
   *
   * @throws IllegalArgumentException whose message says what was expected (for a
   *     {@code name: value (expected: …)} message built by the caller, who knows the name)
   */
  public static long parse(String text) {
    String s = text.trim();
    int end = 0;
    while (end < s.length() && Character.isDigit(s.charAt(end))) {
      end++;
    }
    if (end == 0) {
      throw new IllegalArgumentException("a byte size such as 4096, 512MiB or 8GiB");
    }
    int shift = switch (s.substring(end).trim().toLowerCase(Locale.ROOT)) {
      case "", "b" -> 0;
      case "k", "kb", "kib" -> 10;
      case "m", "mb", "mib" -> 20;
      case "g", "gb", "gib" -> 30;
      case "t", "tb", "tib" -> 40;
      default -> throw new IllegalArgumentException("a byte size with suffix B, KiB, MiB, GiB or TiB");
    };
    long value;
    try {
      value = Long.parseLong(s.substring(0, end));
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("a size below 8 EiB");
    }
    if (value > (Long.MAX_VALUE >> shift)) {
      throw new IllegalArgumentException("a size below 8 EiB");
    }
    return value << shift;
  }

  /** {@code 512 B}, {@code 4.0 KiB}, {@code 64.0 MiB}. */
  public static String format(long bytes) {
    if (bytes < 1024 && bytes > -1024) {
      return bytes + " B";
    }
    double value = bytes;
    int unit = 0;
    while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
      value /= 1024;
      unit++;
    }
    return String.format(Locale.ROOT, "%.1f %s", value, UNITS[unit]);
  }

  /** A compact label for a size that is a whole number of units: {@code 4KiB}, {@code 64MiB}. */
  public static String label(long bytes) {
    int unit = 0;
    long value = bytes;
    while (value >= 1024 && value % 1024 == 0 && unit < UNITS.length - 1) {
      value /= 1024;
      unit++;
    }
    return value + UNITS[unit];
  }

  /** {@code 850 ms}, {@code 12.3 s}, {@code 5m07s}, {@code 2h03m}. */
  public static String formatMillis(long millis) {
    if (millis < 1000) {
      return millis + " ms";
    }
    if (millis < 60_000) {
      return String.format(Locale.ROOT, "%.1f s", millis / 1000.0);
    }
    long seconds = millis / 1000;
    if (seconds < 3600) {
      return String.format(Locale.ROOT, "%dm%02ds", seconds / 60, seconds % 60);
    }
    return String.format(Locale.ROOT, "%dh%02dm", seconds / 3600, seconds % 3600 / 60);
  }
}

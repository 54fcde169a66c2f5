package io.gpumemd.ctl;

import java.util.Locale;

/**
 * Byte sizes and durations as people write and read them: parses {@code 4096}, {@code 512KiB},
 * {@code 64MiB}, {@code 1GiB} (every suffix binary, as the daemon's flags) and formats
 * {@code 67108864} as {@code 64.0 MiB}. Stateless and thread-safe.
 */
final class Sizes {
  private static final String[] UNITS = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};

  private Sizes() {}

  /**
   * @param name the flag, for the error message
   * @throws UsageException when the text is not a size or overflows
   */
  static long parse(String name, String text) {
    String s = text.trim();
    int end = 0;
    while (end < s.length() && Character.isDigit(s.charAt(end))) {
      end++;
    }
    if (end == 0) {
      throw UsageException.of(name, "'" + text + "'", "a byte size such as 4096, 512KiB, 64MiB or 1GiB");
    }
    int shift = switch (s.substring(end).trim().toLowerCase(Locale.ROOT)) {
      case "", "b" -> 0;
      case "k", "kb", "kib" -> 10;
      case "m", "mb", "mib" -> 20;
      case "g", "gb", "gib" -> 30;
      case "t", "tb", "tib" -> 40;
      default -> throw UsageException.of(name, "'" + text + "'", "a byte size with suffix B, KiB, MiB, GiB or TiB");
    };
    long value;
    try {
      value = Long.parseLong(s.substring(0, end));
    } catch (NumberFormatException e) {
      throw UsageException.of(name, "'" + text + "'", "a size below 8 EiB");
    }
    if (value > (Long.MAX_VALUE >> shift)) {
      throw UsageException.of(name, "'" + text + "'", "a size below 8 EiB");
    }
    return value << shift;
  }

  /** {@code 512 B}, {@code 4.0 KiB}, {@code 64.0 MiB}. */
  static String format(long bytes) {
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
  static String label(long bytes) {
    int unit = 0;
    long value = bytes;
    while (value >= 1024 && value % 1024 == 0 && unit < UNITS.length - 1) {
      value /= 1024;
      unit++;
    }
    return value + UNITS[unit];
  }

  /** {@code 850 ms}, {@code 12.3 s}, {@code 5m07s}, {@code 2h03m}. */
  static String formatMillis(long millis) {
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

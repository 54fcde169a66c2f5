package io.gpumemd.server.config;

import java.util.Locale;

/**
 * Parses byte sizes written by people: {@code 4096}, {@code 512MiB}, {@code 8GiB}, {@code 2g}.
 * Every suffix is binary (K/KiB = 1024). Stateless and thread-safe.
 */
public final class Sizes {
  private Sizes() {}

  /**
   * @param name the option, for the error message
   * @throws ConfigException when the text is not a size or overflows
   */
  public static long parse(String name, String text) {
    String s = text.trim();
    int end = 0;
    while (end < s.length() && Character.isDigit(s.charAt(end))) {
      end++;
    }
    if (end == 0) {
      throw ConfigException.of(name, "'" + text + "'", "a byte size such as 4096, 512MiB or 8GiB");
    }
    String unit = s.substring(end).trim().toLowerCase(Locale.ROOT);
    int shift = switch (unit) {
      case "", "b" -> 0;
      case "k", "kb", "kib" -> 10;
      case "m", "mb", "mib" -> 20;
      case "g", "gb", "gib" -> 30;
      case "t", "tb", "tib" -> 40;
      default -> throw ConfigException.of(name, "'" + text + "'",
          "a byte size with suffix B, KiB, MiB, GiB or TiB");
    };
    long value;
    try {
      value = Long.parseLong(s.substring(0, end));
    } catch (NumberFormatException e) {
      throw ConfigException.of(name, "'" + text + "'", "a size below 8 EiB");
    }
    if (value > (Long.MAX_VALUE >> shift)) {
      throw ConfigException.of(name, "'" + text + "'", "a size below 8 EiB");
    }
    return value << shift;
  }
}

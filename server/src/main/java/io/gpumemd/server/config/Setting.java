package io.gpumemd.server.config;

/**
 * One option's raw text as resolved from the layers, and where it came from.
 *
 * @param name the option's name: the flag without {@code --}, and the file key
 * @param value the text, trimmed
 * @param origin {@code default}, {@code flag}, {@code env GPUMEMD_…} or {@code file /path}:
 *     what the start log shows
 */
record Setting(String name, String value, String origin) {

  /** Where the value came from, for an error message: names the flag too. */
  String where() {
    return origin.equals("flag") ? "flag --" + name : origin;
  }

  /** {@code name: 'value' (expected: …) [where]}. */
  String problem(String expected) {
    return name + ": '" + value + "' (expected: " + expected + ") [" + where() + "]";
  }
}

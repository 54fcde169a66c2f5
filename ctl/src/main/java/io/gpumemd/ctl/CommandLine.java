package io.gpumemd.ctl;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * A parsed {@code gpumemctl} command line: the subcommand (the first word that is not a flag),
 * flags given as {@code --name value} or {@code --name=value} anywhere on the line, and boolean
 * switches. Global flags and subcommand flags may be mixed in any order. Each subcommand states
 * the flags it accepts with {@link #allow}; anything else is a usage error. Not thread-safe.
 */
final class CommandLine {
  /** Flags that take no value. */
  static final Set<String> SWITCHES = Set.of("json", "help", "child");

  private final String command;
  private final Map<String, String> flags;

  private CommandLine(String command, Map<String, String> flags) {
    this.command = command;
    this.flags = flags;
  }

  /** @throws UsageException for a flag without its value, a repeated flag or a stray word */
  static CommandLine parse(String[] args) {
    String command = null;
    Map<String, String> flags = new LinkedHashMap<>();
    List<String> stray = new ArrayList<>();
    for (int i = 0; i < args.length; i++) {
      String arg = args[i];
      if (arg.equals("-h")) {
        arg = "--help";
      }
      if (arg.startsWith("--") && arg.length() > 2) {
        String name = arg.substring(2);
        String value;
        int eq = name.indexOf('=');
        if (eq >= 0) {
          value = name.substring(eq + 1);
          name = name.substring(0, eq);
          if (SWITCHES.contains(name)) {
            throw UsageException.of("--" + name, "'" + value + "'", "no value: it is a switch");
          }
        } else if (SWITCHES.contains(name)) {
          value = "true";
        } else if (i + 1 < args.length) {
          value = args[++i];
        } else {
          throw new UsageException("--" + name + ": missing value");
        }
        if (flags.put(name, value) != null) {
          throw new UsageException("--" + name + ": given twice");
        }
      } else if (command == null) {
        command = arg;
      } else {
        stray.add(arg);
      }
    }
    if (!stray.isEmpty()) {
      throw new UsageException("unexpected argument(s): " + String.join(" ", stray));
    }
    return new CommandLine(command, flags);
  }

  /** The subcommand, or null when none was given. */
  String command() {
    return command;
  }

  /** @throws UsageException naming the first flag that is neither global nor in {@code allowed} */
  CommandLine allow(Set<String> global, String... allowed) {
    Set<String> ok = new TreeSet<>(global);
    ok.addAll(List.of(allowed));
    for (String name : flags.keySet()) {
      if (!ok.contains(name)) {
        throw new UsageException("--" + name + ": unknown flag for '" + (command == null ? "gpumemctl" : command)
            + "' (expected one of: --" + String.join(", --", ok) + ")");
      }
    }
    return this;
  }

  boolean has(String name) {
    return flags.containsKey(name);
  }

  String string(String name, String fallback) {
    return flags.getOrDefault(name, fallback);
  }

  /** The flag as an int in {@code [min, max]}, or {@code fallback} when absent. */
  int integer(String name, int fallback, int min, int max) {
    String text = flags.get(name);
    if (text == null) {
      return fallback;
    }
    try {
      int value = Integer.parseInt(text.trim());
      if (value >= min && value <= max) {
        return value;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    throw UsageException.of("--" + name, "'" + text + "'", "an integer in [" + min + ", " + max + "]");
  }

  /** The flag as a long in {@code [min, max]}, or {@code fallback} when absent. */
  long longValue(String name, long fallback, long min, long max) {
    String text = flags.get(name);
    if (text == null) {
      return fallback;
    }
    try {
      long value = Long.parseLong(text.trim());
      if (value >= min && value <= max) {
        return value;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    throw UsageException.of("--" + name, "'" + text + "'", "an integer in [" + min + ", " + max + "]");
  }

  /** The flag as a number of seconds ({@code 0.25} allowed) in {@code [min, max]}. */
  double seconds(String name, double fallback, double min, double max) {
    String text = flags.get(name);
    if (text == null) {
      return fallback;
    }
    try {
      double value = Double.parseDouble(text.trim());
      if (value >= min && value <= max) {
        return value;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    throw UsageException.of("--" + name, "'" + text + "'", "seconds in [" + min + ", " + max + "]");
  }

  /** The flag as a byte size, or {@code fallback} when absent. */
  long size(String name, long fallback) {
    String text = flags.get(name);
    return text == null ? fallback : Sizes.parse("--" + name, text);
  }

  /** A required byte size. */
  long requiredSize(String name) {
    if (!flags.containsKey(name)) {
      throw new UsageException("--" + name + ": required (e.g. --" + name + " 64MiB)");
    }
    return Sizes.parse("--" + name, flags.get(name));
  }

  /** A comma-separated list of byte sizes. */
  List<Long> sizes(String name, List<Long> fallback) {
    String text = flags.get(name);
    if (text == null) {
      return fallback;
    }
    List<Long> out = new ArrayList<>();
    for (String part : text.split(",")) {
      long size = Sizes.parse("--" + name, part);
      if (size <= 0) {
        throw UsageException.of("--" + name, "'" + part + "'", "a size above 0");
      }
      out.add(size);
    }
    return out;
  }
}

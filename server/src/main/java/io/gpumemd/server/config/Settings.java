package io.gpumemd.server.config;

import io.gpumemd.common.Sizes;
import io.gpumemd.server.books.Quota;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The resolved {@link Setting}s of one parse, read as typed values. A reader never throws: a bad
 * value is recorded as a problem and a harmless placeholder returned, so that every bad value is
 * found before {@link ServerOptions} reports them together. One instance per parse; not
 * thread-safe.
 */
final class Settings {
  private final Map<String, Setting> byName = new LinkedHashMap<>();
  private final List<String> problems = new ArrayList<>();
  private final Set<String> bad = new HashSet<>();
  private Map<String, Quota> quotas = Map.of();

  void put(Setting setting) {
    byName.put(setting.name(), setting);
  }

  Setting get(String name) {
    Setting s = byName.get(name);
    if (s == null) {
      throw new IllegalArgumentException("no option " + name);
    }
    return s;
  }

  /** Where each value came from, by option name (for {@link ServerConfig#sources()}). */
  Map<String, String> sources() {
    Map<String, String> out = new LinkedHashMap<>();
    byName.forEach((name, s) -> out.put(name, s.origin()));
    return out;
  }

  /** The {@code --config} file's per-client quotas, by client name. */
  Map<String, Quota> quotas() {
    return quotas;
  }

  void quotas(Map<String, Quota> byClient) {
    quotas = Map.copyOf(byClient);
  }

  void problem(String problem) {
    problems.add(problem);
  }

  void problem(Setting setting, String expected) {
    problems.add(setting.problem(expected));
    bad.add(setting.name());
  }

  /** False once a problem has been found with the named value. */
  boolean valid(String name) {
    return !bad.contains(name);
  }

  List<String> problems() {
    return problems;
  }

  String text(String name) {
    return get(name).value();
  }

  /** A path, or null when the text is empty. */
  Path path(String name) {
    String value = text(name);
    return value.isEmpty() ? null : Path.of(value);
  }

  /** A byte size ({@code 4096}, {@code 512MiB}); never negative. */
  long size(String name) {
    return size(get(name));
  }

  long size(Setting s) {
    try {
      return Sizes.parse(s.value());
    } catch (IllegalArgumentException e) {
      problem(s, e.getMessage());
      return 0;
    }
  }

  long integer(String name, long min, long max) {
    return integer(get(name), min, max);
  }

  long integer(Setting s, long min, long max) {
    try {
      long value = Long.parseLong(s.value());
      if (value >= min && value <= max) {
        return value;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    problem(s, max == Long.MAX_VALUE ? "an integer >= " + min : "an integer in [" + min + ", " + max + "]");
    return min;
  }

  /** One of {@code allowed}, case-insensitive; returns it as spelled in {@code allowed}. */
  String choice(String name, List<String> allowed) {
    Setting s = get(name);
    for (String a : allowed) {
      if (a.equalsIgnoreCase(s.value())) {
        return a;
      }
    }
    String expected = allowed.size() == 1 ? allowed.get(0)
        : String.join(", ", allowed.subList(0, allowed.size() - 1)) + " or " + allowed.get(allowed.size() - 1);
    problem(s, expected);
    return allowed.get(0);
  }

  /** A number in (0, 1]. */
  double fraction(String name) {
    Setting s = get(name);
    try {
      double value = Double.parseDouble(s.value());
      if (value > 0 && value <= 1) {
        return value;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    problem(s, "a number in (0, 1]");
    return 1;
  }
}

package io.gpumemd.it.hardening;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A strict reading of one {@code /metrics} reply in the Prometheus text format 0.0.4, for tests
 * that must know the reply is well formed, not only that some lines are in it (what {@code
 * promtool check metrics} rejects, as far as it matters here): every sample belongs to a family
 * declared by a {@code # TYPE} line, its labels and value parse, no series appears twice, and no
 * counter sample is negative or NaN. {@link #parse} lists the problems; the samples' values are
 * kept by series. Immutable.
 */
final class ExpositionText {
  private static final Pattern TYPE = Pattern.compile("# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|summary|histogram|untyped)");
  private static final Pattern SAMPLE = Pattern.compile("([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{(.*)\\})? (\\S+)( -?\\d+)?");
  private static final Pattern LABEL = Pattern.compile("([a-zA-Z_][a-zA-Z0-9_]*)=\"((?:[^\"\\\\\\n]|\\\\[\\\\\"n])*)\"(,|$)");
  private static final List<String> SUFFIXES = List.of("", "_total", "_count", "_sum", "_bucket", "_created");

  private final Map<String, String> types;
  private final Map<String, Double> values;
  private final List<String> problems;

  private ExpositionText(Map<String, String> types, Map<String, Double> values, List<String> problems) {
    this.types = types;
    this.values = values;
    this.problems = problems;
  }

  static ExpositionText parse(String text) {
    Map<String, String> types = new HashMap<>();
    Map<String, Double> values = new HashMap<>();
    List<String> problems = new ArrayList<>();
    Set<String> series = new HashSet<>();
    for (String line : text.split("\n")) {
      if (line.isEmpty() || line.startsWith("# HELP ")) {
        continue;
      }
      Matcher type = TYPE.matcher(line);
      if (type.matches()) {
        if (types.put(type.group(1), type.group(2)) != null) {
          problems.add("family declared twice: " + line);
        }
        continue;
      }
      Matcher sample = SAMPLE.matcher(line);
      if (line.startsWith("#") || !sample.matches()) {
        problems.add("not a sample, HELP or TYPE line: " + line);
        continue;
      }
      String name = sample.group(1);
      String labels = sample.group(3) == null ? "" : sample.group(3);
      Matcher label = LABEL.matcher(labels);
      int end = 0;
      while (label.find() && label.start() == end) {
        end = label.end();
      }
      if (end != labels.length()) {
        problems.add("labels do not parse: " + line);
      }
      Double value = value(sample.group(4));
      String family = family(name, types);
      if (value == null) {
        problems.add("value does not parse: " + line);
      } else if (family == null) {
        problems.add("sample of no declared family: " + line);
      } else if ("counter".equals(types.get(family)) && !(value >= 0)) {
        problems.add("counter is negative or NaN: " + line);
      }
      if (!series.add(name + "{" + labels + "}")) {
        problems.add("series appears twice: " + line);
      }
      values.put(name + "{" + labels + "}", value);
    }
    return new ExpositionText(types, values, problems);
  }

  private static Double value(String text) {
    switch (text) {
      case "+Inf":
        return Double.POSITIVE_INFINITY;
      case "-Inf":
        return Double.NEGATIVE_INFINITY;
      case "NaN":
        return Double.NaN;
      default:
        try {
          return text.matches("[-+]?[0-9.]+([eE][-+]?[0-9]+)?") ? Double.parseDouble(text) : null;
        } catch (NumberFormatException e) {
          return null;
        }
    }
  }

  /** The declared family a sample name belongs to, or null. */
  private static String family(String name, Map<String, String> types) {
    for (String suffix : SUFFIXES) {
      if (name.endsWith(suffix) && types.containsKey(name.substring(0, name.length() - suffix.length()))) {
        return name.substring(0, name.length() - suffix.length());
      }
    }
    return null;
  }

  List<String> problems() {
    return problems;
  }

  /** The declared families (metric names of the TYPE lines). */
  Set<String> families() {
    return new TreeSet<>(types.keySet());
  }

  /** One sample's value, by its name and label text as written ({@code device="0"}); null when absent. */
  Double value(String name, String labels) {
    return values.get(name + "{" + labels + "}");
  }
}

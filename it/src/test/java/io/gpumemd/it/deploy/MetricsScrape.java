package io.gpumemd.it.deploy;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * The series of one {@code /metrics} scrape (Prometheus text format 0.0.4): metric name to the
 * label sets of its samples. Comments, HELP and TYPE lines are skipped; values are not kept.
 * Immutable after {@link #parse}.
 */
final class MetricsScrape {
  /** Labels that Prometheus attaches at scrape time, so a query may match on them. */
  static final Set<String> TARGET_LABELS = Set.of("instance", "job");

  private final Map<String, List<Map<String, String>>> series;

  private MetricsScrape(Map<String, List<Map<String, String>>> series) {
    this.series = series;
  }

  static MetricsScrape parse(String text) {
    Map<String, List<Map<String, String>>> series = new LinkedHashMap<>();
    for (String line : text.split("\n")) {
      line = line.strip();
      if (line.isEmpty() || line.startsWith("#")) {
        continue;
      }
      int i = 0;
      while (i < line.length() && line.charAt(i) != '{' && !Character.isWhitespace(line.charAt(i))) {
        i++;
      }
      String name = line.substring(0, i);
      Map<String, String> labels = new LinkedHashMap<>();
      if (i < line.length() && line.charAt(i) == '{') {
        i++;
        while (line.charAt(i) != '}') {
          int eq = line.indexOf('=', i);
          String label = line.substring(i, eq).strip();
          StringBuilder value = new StringBuilder();
          int j = eq + 2; // past ="
          while (line.charAt(j) != '"') {
            if (line.charAt(j) == '\\') {
              j++;
            }
            value.append(line.charAt(j++));
          }
          labels.put(label, value.toString());
          i = j + 1;
          if (line.charAt(i) == ',') {
            i++;
          }
        }
      }
      series.computeIfAbsent(name, k -> new ArrayList<>()).add(labels);
    }
    return new MetricsScrape(series);
  }

  boolean has(String metric) {
    return series.containsKey(metric);
  }

  /** The label names the metric's samples carry. */
  Set<String> labels(String metric) {
    Set<String> labels = new TreeSet<>();
    series.getOrDefault(metric, List.of()).forEach(l -> labels.addAll(l.keySet()));
    return labels;
  }

  /** The values the label takes on the metric's samples. */
  Set<String> values(String metric, String label) {
    Set<String> values = new TreeSet<>();
    for (Map<String, String> l : series.getOrDefault(metric, List.of())) {
      if (l.containsKey(label)) {
        values.add(l.get(label));
      }
    }
    return values;
  }

  Set<String> metrics() {
    return new TreeSet<>(series.keySet());
  }
}

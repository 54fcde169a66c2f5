package io.gpumemd.it.deploy;

import java.util.ArrayList;
import java.util.List;
import java.util.Set;

/**
 * The series selectors a PromQL expression names: each metric name with its label matchers.
 * Enough PromQL for dashboard checks, not a parser: a scanner that drops what cannot name a
 * metric (strings, range and subquery brackets, numbers and durations, Grafana variables such
 * as {@code $__rate_interval}, function and aggregation names, the label lists of
 * {@code by/without/on/ignoring/group_left/group_right}) and reports every other identifier as a
 * metric. So a misspelt metric is reported rather than silently skipped: the check errs towards
 * failing. Stateless; thread-safe.
 */
final class PromqlSelectors {
  /** One label matcher: {@code label op "value"}. */
  record Matcher(String label, String op, String value) {}

  /** A metric named by an expression, with its matchers (empty when it has none). */
  record Selector(String metric, List<Matcher> matchers) {}

  private static final Set<String> AGGREGATIONS = Set.of("sum", "min", "max", "avg", "group",
      "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile", "limitk",
      "limit_ratio");
  /** Keywords followed by a parenthesised list of label names (for group_*: optional). */
  private static final Set<String> LABEL_LIST_KEYWORDS = Set.of("by", "without", "on", "ignoring",
      "group_left", "group_right");
  private static final Set<String> KEYWORDS = Set.of("and", "or", "unless", "offset", "bool",
      "atan2", "inf", "nan");

  private PromqlSelectors() {}

  /** The selectors of {@code expr}, in order of appearance. */
  static List<Selector> of(String expr) {
    return new Scanner(expr).scan();
  }

  private static final class Scanner {
    private final String s;
    private int i;
    private final List<Selector> out = new ArrayList<>();

    Scanner(String s) {
      this.s = s;
    }

    List<Selector> scan() {
      while (i < s.length()) {
        char c = s.charAt(i);
        if (Character.isWhitespace(c)) {
          i++;
        } else if (c == '"' || c == '\'' || c == '`') {
          skipString();
        } else if (c == '#') {
          while (i < s.length() && s.charAt(i) != '\n') {
            i++;
          }
        } else if (c == '[') {
          skipPast(']');
        } else if (c == '$') {
          skipVariable();
        } else if (c == '{') {
          // a selector without a metric name: {__name__="..."}
          List<Matcher> matchers = matchers();
          matchers.stream().filter(m -> m.label().equals("__name__") && m.op().equals("="))
              .findFirst().ifPresent(m -> out.add(new Selector(m.value(), matchers)));
        } else if (Character.isDigit(c) || (c == '.' && i + 1 < s.length() && Character.isDigit(s.charAt(i + 1)))) {
          while (i < s.length() && (Character.isLetterOrDigit(s.charAt(i)) || s.charAt(i) == '.')) {
            i++; // numbers, 1e3, 0x1f, durations such as 5m or 1h30m
          }
        } else if (isIdentStart(c)) {
          identifier();
        } else {
          i++; // operators, parentheses, commas, @
        }
      }
      return out;
    }

    private void identifier() {
      String name = readIdentifier();
      int after = skipSpaces(i);
      char next = after < s.length() ? s.charAt(after) : '\0';
      if (LABEL_LIST_KEYWORDS.contains(name)) {
        if (next == '(') {
          i = after;
          skipPast(')');
        }
      } else if (KEYWORDS.contains(name) || AGGREGATIONS.contains(name) || next == '(') {
        // a function call, an aggregation (its "by (...)" may come before the parenthesis)
        // or a binary operator keyword; "start()"/"end()" after @ land here too
      } else {
        List<Matcher> matchers = List.of();
        if (next == '{') {
          i = after;
          matchers = matchers();
        }
        out.add(new Selector(name, matchers));
      }
    }

    /** Parses {@code {a="x", b=~"y"}} from the opening brace. */
    private List<Matcher> matchers() {
      List<Matcher> matchers = new ArrayList<>();
      i++; // {
      while (true) {
        i = skipSpaces(i);
        if (i >= s.length()) {
          throw new IllegalArgumentException("unclosed '{' in: " + s);
        }
        char c = s.charAt(i);
        if (c == '}') {
          i++;
          return matchers;
        }
        if (c == ',') {
          i++;
          continue;
        }
        String label = c == '"' ? readString() : readIdentifier();
        if (label.isEmpty()) {
          throw new IllegalArgumentException("label name expected at " + i + " in: " + s);
        }
        i = skipSpaces(i);
        int start = i;
        while (i < s.length() && "=!~".indexOf(s.charAt(i)) >= 0) {
          i++;
        }
        String op = s.substring(start, i);
        if (!Set.of("=", "!=", "=~", "!~").contains(op)) {
          throw new IllegalArgumentException("matcher operator expected after " + label + " in: " + s);
        }
        i = skipSpaces(i);
        matchers.add(new Matcher(label, op, readString()));
      }
    }

    private String readIdentifier() {
      int start = i;
      while (i < s.length() && (isIdentStart(s.charAt(i)) || Character.isDigit(s.charAt(i)))) {
        i++;
      }
      return s.substring(start, i);
    }

    /** Reads a quoted string at {@code i} and returns its content (escapes kept as written). */
    private String readString() {
      if (i >= s.length() || "\"'`".indexOf(s.charAt(i)) < 0) {
        throw new IllegalArgumentException("string expected at " + i + " in: " + s);
      }
      int start = i + 1;
      skipString();
      return s.substring(start, i - 1);
    }

    private void skipString() {
      char quote = s.charAt(i++);
      while (i < s.length() && s.charAt(i) != quote) {
        i += s.charAt(i) == '\\' && quote != '`' ? 2 : 1;
      }
      if (i >= s.length()) {
        throw new IllegalArgumentException("unclosed string in: " + s);
      }
      i++;
    }

    private void skipPast(char close) {
      int end = s.indexOf(close, i);
      if (end < 0) {
        throw new IllegalArgumentException("unclosed '" + s.charAt(i) + "' in: " + s);
      }
      i = end + 1;
    }

    /** $name, ${name}, ${name:format}, [[name]] is not used by current Grafana. */
    private void skipVariable() {
      i++;
      if (i < s.length() && s.charAt(i) == '{') {
        skipPast('}');
      } else {
        readIdentifier();
      }
    }

    private int skipSpaces(int from) {
      while (from < s.length() && Character.isWhitespace(s.charAt(from))) {
        from++;
      }
      return from;
    }

    private static boolean isIdentStart(char c) {
      return Character.isLetter(c) || c == '_' || c == ':';
    }
  }
}

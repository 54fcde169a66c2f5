package io.gpumemd.server.config;

import java.util.List;

/**
 * The configuration is wrong. Carries every problem found, each of the form
 * {@code name: 'value' (expected: …) [where it came from]}, so that an operator fixes them all
 * in one go; the message lists them.
 */
public final class ConfigException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final List<String> problems;

  public ConfigException(List<String> problems) {
    super(message(problems), null, false, false);
    this.problems = List.copyOf(problems);
  }

  /** Each problem, one line each, in the order found. */
  public List<String> problems() {
    return problems;
  }

  private static String message(List<String> problems) {
    if (problems.size() == 1) {
      return problems.get(0);
    }
    StringBuilder out = new StringBuilder().append(problems.size()).append(" invalid settings:");
    problems.forEach(p -> out.append("\n  ").append(p));
    return out.toString();
  }
}

package io.gpumemd.server.config;

import java.util.List;
import java.util.Map;

/**
 * How the daemon logs; part of {@link ServerConfig}. Read before the first logger exists.
 *
 * @param format {@code plain} or {@code json} ({@code --log-format})
 * @param level the level of gpumemd's own loggers, TRACE to ERROR ({@code --log-level})
 */
public record LoggingConfig(String format, String level) {

  /** Reads and checks the logging options; a problem is recorded in {@code s}. */
  static LoggingConfig from(Settings s) {
    return new LoggingConfig(
        s.choice("log-format", List.of("plain", "json")),
        s.choice("log-level", List.of("TRACE", "DEBUG", "INFO", "WARN", "ERROR")));
  }

  /** Each value by option name, as the start log shows it. */
  void describeTo(Map<String, Object> values) {
    values.put("log-format", format);
    values.put("log-level", level);
  }
}

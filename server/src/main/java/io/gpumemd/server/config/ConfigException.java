package io.gpumemd.server.config;

/** A configuration value is missing or wrong; the message names it and what was expected. */
public final class ConfigException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public ConfigException(String message) {
    super(message, null, false, false);
  }

  public static ConfigException of(String name, Object value, String expected) {
    return new ConfigException(name + ": " + value + " (expected: " + expected + ")");
  }
}

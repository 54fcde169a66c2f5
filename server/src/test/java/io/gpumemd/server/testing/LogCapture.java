package io.gpumemd.server.testing;

import ch.qos.logback.classic.Level;
import ch.qos.logback.classic.Logger;
import ch.qos.logback.classic.spi.ILoggingEvent;
import ch.qos.logback.core.read.ListAppender;
import java.util.List;
import java.util.stream.Collectors;
import org.slf4j.LoggerFactory;

/** Collects what one logger writes, for tests that check what operators are told. */
public final class LogCapture implements AutoCloseable {
  private final Logger logger;
  private final ListAppender<ILoggingEvent> appender = new ListAppender<>();
  private final Level previousLevel;

  public LogCapture(Class<?> type) {
    this(type.getName(), null);
  }

  /** Captures a logger by name (e.g. one of gRPC's), at its configured level. */
  public LogCapture(String name) {
    this(name, null);
  }

  /** Captures DEBUG and above as well, whatever the configured level; restored at close. */
  public static LogCapture withDebug(Class<?> type) {
    return new LogCapture(type.getName(), Level.DEBUG);
  }

  private LogCapture(String name, Level level) {
    logger = (Logger) LoggerFactory.getLogger(name);
    previousLevel = logger.getLevel();
    if (level != null) {
      logger.setLevel(level);
    }
    appender.start();
    logger.addAppender(appender);
  }

  /** Formatted messages at a level (e.g. "WARN"). */
  public List<String> messages(String level) {
    synchronized (appender.list) {
      return appender.list.stream().filter(e -> e.getLevel().toString().equals(level))
          .map(ILoggingEvent::getFormattedMessage).collect(Collectors.toList());
    }
  }

  /** Whether any captured event carries an exception (a stack trace in the log). */
  public boolean anyStackTrace() {
    synchronized (appender.list) {
      return appender.list.stream().anyMatch(e -> e.getThrowableProxy() != null);
    }
  }

  @Override
  public void close() {
    logger.detachAppender(appender);
    logger.setLevel(previousLevel);
  }
}

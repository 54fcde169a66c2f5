package io.gpumemd.server.testing;

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

  public LogCapture(Class<?> type) {
    logger = (Logger) LoggerFactory.getLogger(type);
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

  @Override
  public void close() {
    logger.detachAppender(appender);
  }
}
